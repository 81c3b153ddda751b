"""The one distillation loop: a float teacher trains its lossy copy (fake-quantized for QAT, 2:4-masked for
the sparsity fine-tune) to give the same outputs and hidden states.

    result = distill(student, teacher, batches, kind, DistillConfig(steps=200))

`batches` is an endless iterator of global batches (edgeattn.text builds them). The loop runs on
CPU or CUDA, data-parallel under `torchrun` (DDP; gloo on CPU, nccl on CUDA: every rank takes an equal
slice of each global batch, so N processes follow one process), stops at `steps` or at a wall-clock
`time_budget_s`, whichever comes first, and writes atomic checkpoints it resumes from. torch is imported
inside the functions, so the config can be imported (by the CLI, by job dataclasses) without it.
"""

from __future__ import annotations

import io
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from edgeattn import atomic
from edgeattn.errors import ConfigError
from edgeattn.gpu import check_device_name, resolve_device, torch_cuda_available
from edgeattn.quantize.progress import StepProgress
from edgeattn.runtime.cuda.devices import keep_multicast_off

SCHEDULES = ("constant", "cosine", "linear")
HIDDEN_NORMS = ("token", "layer")
TRAINABLE = ("all", "linears_and_norms")
WARMUP_STEPS = 10  # linear schedule: warm-up steps; also when the per-step time estimate starts


@dataclass(frozen=True)
class DistillConfig:
    """How the student is trained. The QAT defaults; `sparsity_finetune` gives the 2:4 fine-tune's."""

    steps: int = 200
    time_budget_s: float | None = None  # also stop after this many seconds; the schedule then runs on time
    lr: float = 1e-5  # weights (and norms)
    scale_lr: float = 1e-3  # learned log step sizes of fake quantizers
    lr_schedule: str = "constant"  # cosine: both rates decay to 10% by the end; linear: 10 warm-up steps, then to 0
    output_weight: float = 1.0  # output term: KL of next-token distributions (decoders), 1 - pooled cosine (encoders)
    hidden_weight: float = 1.0  # hidden-state MSE term (0: outputs only, and no hidden states are kept)
    hidden_norm: str = "token"  # token: error over the teacher's mean square at each token; layer: over its variance
    trainable: str = "all"  # all: every parameter that requires grad; linears_and_norms: Linear (K % 4 == 0) and
    # LayerNorm weights only (the 2:4 fine-tune; frozen again afterwards)
    train_embeddings: bool = False  # linears_and_norms: also the embedding tables
    clip_grad_norm: float | None = None
    bf16: bool = False  # autocast the forward passes to bfloat16 (CUDA)
    seed: int = 0
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 50
    device: str = "auto"  # auto: cuda when available, else cpu; or cpu, cuda, cuda:N
    progress: bool = True  # a progress bar on rank 0

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ConfigError(f"steps: expected >= 0, found {self.steps}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ConfigError(f"time_budget_s: expected > 0, found {self.time_budget_s}")
        if not (self.lr >= 0 and self.scale_lr >= 0):
            raise ConfigError(f"learning rates: expected >= 0, found lr={self.lr}, scale_lr={self.scale_lr}")
        if not (self.output_weight >= 0 and self.hidden_weight >= 0):
            raise ConfigError(f"loss weights: expected >= 0, found output_weight={self.output_weight}, "
                              f"hidden_weight={self.hidden_weight}")
        if self.checkpoint_every < 1:
            raise ConfigError(f"checkpoint_every: expected >= 1, found {self.checkpoint_every}")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ConfigError(f"clip_grad_norm: expected > 0, found {self.clip_grad_norm}")
        for name, value, allowed in (("lr_schedule", self.lr_schedule, SCHEDULES),
                                     ("hidden_norm", self.hidden_norm, HIDDEN_NORMS),
                                     ("trainable", self.trainable, TRAINABLE)):
            if value not in allowed:
                raise ConfigError(f"{name}: expected one of {', '.join(allowed)}, found {value!r}")
        check_device_name(self.device, auto=True)

    def as_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


def sparsity_finetune(kind: str, **fields) -> DistillConfig:
    """The 2:4 fine-tune's settings: lr 1e-4 with warm-up and linear decay, Linear and LayerNorm weights,
    gradients clipped at 1; encoders match hidden states (over each layer's variance) and the pooled
    cosine, decoders the next-token distributions only. `fields` override any of them."""
    base = dict(steps=200, lr=1e-4, lr_schedule="linear", hidden_norm="layer", trainable="linears_and_norms",
                clip_grad_norm=1.0, progress=False, hidden_weight=0.0 if kind == "decoder" else 1.0, device="cpu")
    return DistillConfig(**{**base, **fields})


@dataclass
class DistillResult:
    losses: list[float] = field(default_factory=list)  # one per step run in this call (this rank's)
    steps_run: int = 0  # steps done in total, resumed ones included
    trained_tensors: int = 0
    seconds: float = 0.0

    def section(self, config: DistillConfig) -> dict:
        """For a manifest."""
        return {"config": config.as_dict(), "steps_run": self.steps_run, "trained_tensors": self.trained_tensors,
                "loss_first": self.losses[0] if self.losses else None,
                "loss_last": self.losses[-1] if self.losses else None, "seconds": round(self.seconds, 1)}


# -- distributed and device ------------------------------------------------------------------------

def _dist() -> tuple[int, int]:
    import torch

    d = torch.distributed
    return (d.get_rank(), d.get_world_size()) if d.is_available() and d.is_initialized() else (0, 1)


def init_distributed() -> tuple[int, int]:
    """Join the process group torchrun describes (WORLD_SIZE > 1); (rank, world size)."""
    import torch

    keep_multicast_off()  # NCCL_NVLS_ENABLE=0 and the like, unless set: docs/serving.md "Several GPUs"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        # gloo for CPU tensors, nccl for CUDA ones: a CPU run on a GPU machine needs gloo too
        torch.distributed.init_process_group("cpu:gloo,cuda:nccl" if torch_cuda_available() else "gloo")
    return _dist()


# -- loss ------------------------------------------------------------------------------------------

def _masked_mean(x, mask):
    """Per-example mean of x [B, S] over valid tokens: [B]."""
    return (x * mask).sum(1) / mask.sum(1).clamp_min(1)


def pool(hidden, mask):
    """Sentence embedding: masked mean pooling, then L2 normalisation. hidden: [B, S, H] -> [B, H]."""
    import torch.nn.functional as F

    m = mask.unsqueeze(-1).to(hidden.dtype)
    return F.normalize((hidden * m).sum(1) / m.sum(1).clamp_min(1e-9), dim=-1)


def _hidden_term(student_hidden, teacher_hidden, mask, norm: str):
    """Mean over layers of the hidden-state MSE: per example [B] (token norm) or one scalar (layer norm)."""
    import torch

    pairs = list(zip(student_hidden[1:], teacher_hidden[1:]))  # after the embeddings
    if norm == "layer":  # each layer's error over the teacher layer's variance, padding masked out
        m = mask.unsqueeze(-1).to(pairs[0][0].dtype)  # [B, S, 1]
        return torch.stack([(((a - b) * m) ** 2).sum() / (m.sum() * a.shape[-1]) / b.var() for a, b in pairs]).mean()
    m = mask.float()
    total = 0.0
    for hs, ht in pairs:  # each token's error over the teacher's mean square at that token
        var = ht.pow(2).mean(-1, keepdim=True).clamp_min(1e-6)
        total = total + _masked_mean(((hs - ht) ** 2 / var).mean(-1), m)
    return total / max(1, len(pairs))


def distill_loss(student_out, teacher_out, mask, kind: str, cfg: DistillConfig):
    """output_weight * output term + hidden_weight * hidden term, averaged over the batch.

    Output term: KL(teacher || student) of next-token distributions per valid token (decoders); 1 - cosine
    of the mean-pooled sentence embeddings (encoders)."""
    import torch.nn.functional as F

    if kind == "decoder":
        kl = F.kl_div(F.log_softmax(student_out.logits, -1), F.log_softmax(teacher_out.logits, -1),
                      log_target=True, reduction="none").sum(-1)  # [B, S]
        out = _masked_mean(kl, mask.float())
    else:
        s_h = student_out.last_hidden_state if cfg.hidden_weight == 0 else student_out.hidden_states[-1]
        t_h = teacher_out.last_hidden_state if cfg.hidden_weight == 0 else teacher_out.hidden_states[-1]
        out = 1 - (pool(s_h, mask) * pool(t_h, mask)).sum(-1)  # [B]
    loss = cfg.output_weight * out
    if cfg.hidden_weight:
        loss = loss + cfg.hidden_weight * _hidden_term(student_out.hidden_states, teacher_out.hidden_states, mask,
                                                       cfg.hidden_norm)
    return loss.mean()


# -- schedule --------------------------------------------------------------------------------------

def fraction_done(cfg: DistillConfig, step: int, elapsed_s: float) -> float:
    """How far the run is, 0..1: by steps, or by time when a budget is set, whichever is further."""
    done = step / cfg.steps if cfg.steps else 1.0
    if cfg.time_budget_s is not None:
        done = max(done, elapsed_s / cfg.time_budget_s)
    return done


def lr_factor(step: int, done: float, schedule: str = "linear") -> float:
    """Learning-rate multiplier. linear: WARMUP_STEPS warm-up steps, then a linear decay to zero at the end;
    cosine: from 1 to 0.1 at the end; constant: 1."""
    if schedule == "cosine":
        return 0.1 + 0.45 * (1 + math.cos(math.pi * done))
    if schedule == "linear":
        return min(1.0, (step + 1) / WARMUP_STEPS) * max(0.0, 1.0 - done)
    return 1.0


# -- the loop --------------------------------------------------------------------------------------

def _parameter_groups(student, cfg: DistillConfig):
    """(weights, scales): what the optimizer trains, at lr and at scale_lr."""
    import torch

    from edgeattn.quantize.api import scale_parameters

    if cfg.trainable == "all":
        scales = scale_parameters(student)
        ids = set(map(id, scales))
        return [p for p in student.parameters() if p.requires_grad and id(p) not in ids], scales
    for p in student.parameters():
        p.requires_grad_(False)
    params, seen = [], set()
    for m in student.modules():
        if isinstance(m, torch.nn.LayerNorm) or (isinstance(m, torch.nn.Linear) and m.in_features % 4 == 0) \
                or (cfg.train_embeddings and isinstance(m, torch.nn.Embedding)):
            for p in m.parameters():  # parametrized weights expose `original` here
                if p.data_ptr() not in seen:
                    seen.add(p.data_ptr())
                    p.requires_grad_(True)
                    params.append(p)
    return params, []


def _save(path: Path, student, opt, step: int, cfg: DistillConfig) -> None:
    import torch

    buf = io.BytesIO()
    torch.save({"step": step, "model": student.state_dict(), "optimizer": opt.state_dict(),
                "config": {k: str(v) for k, v in asdict(cfg).items()}}, buf)
    atomic.write_bytes(path, buf.getvalue())


def distill(student, teacher, batches: Iterator[dict], kind: str, cfg: DistillConfig = DistillConfig(),
            log: Callable[[str], None] = lambda msg: None,
            on_step: Callable[[int, float], None] | None = None, task: str = "distillation") -> DistillResult:
    """Train `student` (in place) to follow `teacher` on `batches` (global batches; each rank takes its
    slice). Returns the losses and how many steps ran. `log` gets text lines and, after every step, a
    `StepProgress` named `task` (steps done of the total, elapsed time, the loss)."""
    import torch
    from torch import nn

    rank, world = _dist()
    device = torch.device(resolve_device(cfg.device))
    torch.manual_seed(cfg.seed)
    student.to(device).eval()  # dropout off: the student follows the teacher's deterministic output
    teacher.to(device).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    weights, scales = _parameter_groups(student, cfg)
    groups = [g for g in ({"params": weights, "lr": cfg.lr}, {"params": scales, "lr": cfg.scale_lr}) if g["params"]]
    if not groups:
        raise ConfigError("distillation: expected parameters to train, found none (all frozen?)")
    opt = torch.optim.Adam(groups)
    base_lrs = [g["lr"] for g in opt.param_groups]
    trained = [p for g in groups for p in g["params"]]
    model = student
    if world > 1:
        model = nn.parallel.DistributedDataParallel(student,
                                                    device_ids=[device.index] if device.type == "cuda" else None)
    step = 0
    ckpt = Path(cfg.checkpoint_dir) / "qat_checkpoint.pt" if cfg.checkpoint_dir else None
    if ckpt is not None and ckpt.is_file():
        state = torch.load(ckpt, map_location=device, weights_only=False)
        student.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        for _ in range(step):  # the batches the earlier run took: the resumed run sees the same sequence
            next(batches)
    bar = None
    if cfg.progress and rank == 0 and cfg.steps > step:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, initial=step, desc="distill", unit="step")
    result = DistillResult(trained_tensors=len(trained))
    started = time.time()
    warm = started
    while (done := fraction_done(cfg, step, time.time() - started)) < 1.0:
        for group, lr in zip(opt.param_groups, base_lrs):
            group["lr"] = lr * lr_factor(step, done, cfg.lr_schedule)
        if step == WARMUP_STEPS:
            warm = time.time()
        if cfg.time_budget_s is not None and step == WARMUP_STEPS + 20:  # an estimate, for the log only
            per_step = max((time.time() - warm) / 20, 1e-9)
            left = int((cfg.time_budget_s - (time.time() - started)) / per_step)
            log(f"{per_step * 1e3:.0f} ms/step: about {min(cfg.steps, step + left)} steps fit the "
                f"{cfg.time_budget_s:.0f} s budget")
        batch = next(batches)
        n = batch["input_ids"].shape[0]
        if n % world:
            raise ConfigError(f"batch size {n} must divide evenly across {world} processes")
        per_rank = n // world
        batch = {k: v[rank * per_rank:(rank + 1) * per_rank].to(device) for k, v in batch.items()}
        loss = _step_loss(model, teacher, batch, kind, cfg, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(trained, cfg.clip_grad_norm)
        opt.step()
        result.losses.append(loss.item())
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{result.losses[-1]:.4g}")
        if on_step is not None:
            on_step(step, result.losses[-1])
        step += 1
        if rank == 0:
            elapsed = time.time() - started
            log(StepProgress(task, step, cfg.steps, elapsed, loss=result.losses[-1],
                             fraction=fraction_done(cfg, step, elapsed) if cfg.time_budget_s is not None else None))
        if ckpt is not None and rank == 0 and (step % cfg.checkpoint_every == 0 or step == cfg.steps):
            _save(ckpt, student, opt, step, cfg)
    if bar is not None:
        bar.close()
    log(f"step {step} (done) loss {result.losses[-1]:.4g}" if result.losses else "no distillation steps")
    student.eval()
    if cfg.trainable != "all":
        for p in trained:
            p.requires_grad_(False)
    result.steps_run, result.seconds = step, time.time() - started
    return result


def _step_loss(model, teacher, batch: dict, kind: str, cfg: DistillConfig, device):
    import torch

    kwargs = {"output_hidden_states": True} if cfg.hidden_weight else {}
    if kind == "decoder":
        kwargs["use_cache"] = False
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
        with torch.no_grad():
            t_out = teacher(**batch, **kwargs)
        s_out = model(**batch, **kwargs)
        return distill_loss(s_out, t_out, batch["attention_mask"], kind, cfg).float()
