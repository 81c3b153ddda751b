"""Distillation QAT: the float model teaches the fake-quantized one (outputs and hidden states).

Runs on CPU or CUDA, and data-parallel under `torchrun` (DDP; gloo on CPU, nccl on CUDA): every rank
takes an equal slice of the same global batch, so N processes follow one process at equal global batch.
Checkpoints (student weights, scales, optimizer, step) are written atomically and resumed from.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from edgeattn import atomic
from edgeattn.errors import ConfigError, InputError
from edgeattn.quantize.api import scale_parameters


@dataclass(frozen=True)
class DistillConfig:
    steps: int = 200
    batch_size: int = 16  # global batch, split across ranks
    lr: float = 1e-5  # weights
    scale_lr: float = 1e-3  # log step sizes
    hidden_weight: float = 1.0  # weight of the hidden-state loss next to the output loss
    seed: int = 0
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 50
    device: str = "auto"  # auto: cuda when available, else cpu
    progress: bool = True
    lr_schedule: str = "constant"  # or "cosine": both learning rates decay to 10% by the last step

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ConfigError(f"steps: expected >= 0, found {self.steps}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size: expected >= 1, found {self.batch_size}")
        if not (self.lr >= 0 and self.scale_lr >= 0):
            raise ConfigError(f"learning rates: expected >= 0, found lr={self.lr}, scale_lr={self.scale_lr}")
        if self.checkpoint_every < 1:
            raise ConfigError(f"checkpoint_every: expected >= 1, found {self.checkpoint_every}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ConfigError(f"lr_schedule: expected constant or cosine, found {self.lr_schedule!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device: expected auto, cpu or cuda, found {self.device!r}")


def _dist():
    d = torch.distributed
    return (d.get_rank(), d.get_world_size()) if d.is_available() and d.is_initialized() else (0, 1)


def init_distributed() -> tuple[int, int]:
    """Join the process group torchrun describes (WORLD_SIZE > 1); (rank, world size)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return _dist()


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-example mean of x [B, S] over valid tokens: [B]."""
    return (x * mask).sum(1) / mask.sum(1).clamp_min(1)


def distill_loss(student_out, teacher_out, mask: torch.Tensor, kind: str, hidden_weight: float) -> torch.Tensor:
    """Mean over examples of: output loss + hidden_weight * normalised hidden-state MSE.

    Output loss: KL(teacher || student) of next-token distributions (decoders); 1 - cosine of the
    mean-pooled sentence embedding plus the normalised last-hidden-state MSE (encoders)."""
    m = mask.float()
    hidden = 0.0
    for hs, ht in zip(student_out.hidden_states[1:], teacher_out.hidden_states[1:]):
        var = ht.pow(2).mean(-1, keepdim=True).clamp_min(1e-6)
        hidden = hidden + _masked_mean(((hs - ht) ** 2 / var).mean(-1), m)
    hidden = hidden / max(1, len(teacher_out.hidden_states) - 1)
    if kind == "decoder":
        kl = F.kl_div(F.log_softmax(student_out.logits, -1), F.log_softmax(teacher_out.logits, -1),
                      log_target=True, reduction="none").sum(-1)
        out = _masked_mean(kl, m)
    else:
        es, et = pool(student_out.last_hidden_state, mask), pool(teacher_out.last_hidden_state, mask)
        out = 1 - (es * et).sum(-1)
    return (out + hidden_weight * hidden).mean()


def pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sentence embedding: masked mean pooling, then L2 normalisation. hidden: [B, S, H] -> [B, H]."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return F.normalize((hidden * m).sum(1) / m.sum(1).clamp_min(1e-9), dim=-1)


def _device(cfg: DistillConfig) -> torch.device:
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _save(path: Path, student: nn.Module, opt, step: int, cfg: DistillConfig) -> None:
    buf = io.BytesIO()
    torch.save({"step": step, "model": student.state_dict(), "optimizer": opt.state_dict(),
                "config": {k: str(v) for k, v in asdict(cfg).items()}}, buf)
    atomic.write_bytes(path, buf.getvalue())


def distill(student: nn.Module, teacher: nn.Module, examples: dict[str, torch.Tensor], kind: str,
            cfg: DistillConfig = DistillConfig(), on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Train the calibrated, fake-quantized `student` to follow `teacher` on `examples`
    (equal-length input_ids / attention_mask [N, S]). Returns the loss of each step (this rank's)."""
    n = examples["input_ids"].shape[0]
    rank, world = _dist()
    if cfg.batch_size % world:
        raise ConfigError(f"batch_size {cfg.batch_size} must divide evenly across {world} processes")
    if n < cfg.batch_size:
        raise InputError(f"distillation: expected at least batch_size={cfg.batch_size} training sequences, found {n}")
    device = _device(cfg)
    student.to(device).eval()  # dropout off: the student follows the teacher deterministically
    teacher.to(device).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    scales = set(map(id, scale_parameters(student)))
    weights = [p for p in student.parameters() if p.requires_grad and id(p) not in scales]
    opt = torch.optim.Adam([{"params": weights, "lr": cfg.lr},
                            {"params": scale_parameters(student), "lr": cfg.scale_lr}])
    model = student
    if world > 1:
        model = nn.parallel.DistributedDataParallel(student, device_ids=[device.index] if device.type == "cuda" else None)
    start = 0
    ckpt = Path(cfg.checkpoint_dir) / "qat_checkpoint.pt" if cfg.checkpoint_dir else None
    if ckpt is not None and ckpt.is_file():
        state = torch.load(ckpt, map_location=device, weights_only=False)
        student.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
    losses = []
    bar = None
    if cfg.progress and rank == 0 and cfg.steps > start:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, initial=start, desc="QAT", unit="step")
    per_rank = cfg.batch_size // world
    base_lrs = [group["lr"] for group in opt.param_groups]
    for step in range(start, cfg.steps):
        if cfg.lr_schedule == "cosine":
            f = 0.1 + 0.45 * (1 + math.cos(math.pi * step / max(1, cfg.steps)))
            for group, lr in zip(opt.param_groups, base_lrs):
                group["lr"] = lr * f
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        idx = torch.randperm(n, generator=g)[:cfg.batch_size][rank * per_rank:(rank + 1) * per_rank]
        batch = {k: v[idx].to(device) for k, v in examples.items()}
        if kind == "decoder":
            batch["use_cache"] = False
        with torch.no_grad():
            t_out = teacher(**batch, output_hidden_states=True)
        s_out = model(**batch, output_hidden_states=True)
        loss = distill_loss(s_out, t_out, batch["attention_mask"], kind, cfg.hidden_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.4g}")
        if on_step is not None:
            on_step(step, losses[-1])
        if ckpt is not None and rank == 0 and ((step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps):
            _save(ckpt, student, opt, step + 1, cfg)
    if bar is not None:
        bar.close()
    student.eval()
    return losses
