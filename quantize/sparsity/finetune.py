"""Mask-preserving fine-tuning after 2:4 pruning: distil the pruned student from its float teacher.

Encoders: MSE between the student's and the teacher's hidden states (every layer, padding masked out)
plus 1 - cosine of the pooled sentence embeddings.
Decoders: KL divergence of the next-token distributions. Linear weights and LayerNorms train; the masks of
`edgeattn.quantize.sparsity.masks` stay on (masked entries get zero gradient), so the zeros survive.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from edgeattn.errors import ConfigError, InputError
from edgeattn.optional import require

LOSSES = ("auto", "hidden", "logits")
WARMUP_STEPS = 10  # steps before the logged per-step time estimate starts


@dataclass(frozen=True)
class FinetuneConfig:
    steps: int = 200
    lr: float = 1e-4
    batch: int = 16
    seq_len: int = 128
    seed: int = 0
    loss: str = "auto"  # auto: hidden for encoders, logits for decoders
    time_budget_s: float | None = None  # stop at this many seconds; the learning rate then decays over time
    bf16: bool = False  # autocast forward passes to bfloat16 (CUDA)
    train_embeddings: bool = False  # also train the (unpruned) embedding tables
    cosine_weight: float = 1.0  # encoders: weight of 1 - cosine of the pooled embedding next to the hidden MSE
    length_grouping: int = 16  # encoders: batches cut from a pool of this many, sorted by length (1: random)

    def __post_init__(self) -> None:
        if not self.cosine_weight >= 0:
            raise ConfigError(f"cosine_weight: expected >= 0, found {self.cosine_weight}")
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ConfigError(f"time_budget_s: expected > 0, found {self.time_budget_s}")
        if self.length_grouping < 1:
            raise ConfigError(f"length_grouping: expected >= 1, found {self.length_grouping}")
        if self.steps < 0:
            raise ConfigError(f"steps: expected >= 0, found {self.steps}")
        if not self.lr > 0:
            raise ConfigError(f"lr: expected > 0, found {self.lr}")
        if self.batch < 1 or self.seq_len < 8:
            raise ConfigError(f"batch/seq_len: expected >= 1 and >= 8, found {self.batch}/{self.seq_len}")
        if self.loss not in LOSSES:
            raise ConfigError(f"loss: expected one of {', '.join(LOSSES)}, found {self.loss!r}")


def read_texts(path: str | Path | None = None) -> list[str]:
    """Documents, one a line: from `path`, or gensim's lee_background news corpus (300 documents)."""
    from edgeattn.quantize.data import lee_documents, read_lines

    return lee_documents() if path is None else read_lines(path)


def text_batches(tokenizer, texts: list[str], kind: str, config: FinetuneConfig) -> Iterator[dict]:
    """Endless random batches: sentences (encoders) or token windows of seq_len (decoders)."""
    torch = require("torch")
    gen = torch.Generator().manual_seed(config.seed)
    if kind == "decoder":
        ids = torch.tensor([t for doc in texts for t in tokenizer(doc)["input_ids"]])
        if len(ids) <= config.seq_len:
            raise InputError(f"calibration text: expected more than {config.seq_len} tokens, found {len(ids)}")
        while True:
            starts = torch.randint(0, len(ids) - config.seq_len, (config.batch,), generator=gen)
            x = torch.stack([ids[s:s + config.seq_len] for s in starts.tolist()])  # x: [B, S]
            yield {"input_ids": x, "attention_mask": torch.ones_like(x)}
    sentences = [s.strip().rstrip(".") + "." for doc in texts for s in doc.split(". ") if len(s.split()) >= 3]
    # tokenized once (per-step tokenization cost ~15 ms a batch of 128 on a laptop core), padded per batch
    ids = tokenizer(sentences, truncation=True, max_length=config.seq_len)["input_ids"]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with_types = "token_type_ids" in tokenizer.model_input_names
    pool = config.batch * config.length_grouping
    while True:
        pick = torch.randint(0, len(ids), (pool,), generator=gen).tolist()
        if config.length_grouping == 1:
            yield _padded([ids[i] for i in pick], pad, with_types)
            continue
        # batches of similar lengths, in random order: with random batches of 512 generated sentences
        # (22 tokens on average, padded to the longest, ~112) four fifths of every step was padding
        pick.sort(key=lambda i: len(ids[i]))
        for g in torch.randperm(config.length_grouping, generator=gen).tolist():
            yield _padded([ids[i] for i in pick[g * config.batch:(g + 1) * config.batch]], pad, with_types)


def _padded(rows: list[list[int]], pad: int, with_types: bool) -> dict:
    """Token rows right-padded to the longest: input_ids, attention_mask (and token_type_ids)."""
    torch = require("torch")
    x = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)  # x: [B, S]
    mask = torch.zeros_like(x)
    for j, r in enumerate(rows):
        x[j, :len(r)] = torch.tensor(r)
        mask[j, :len(r)] = 1
    batch = {"input_ids": x, "attention_mask": mask}
    if with_types:
        batch["token_type_ids"] = torch.zeros_like(x)
    return batch


def _loss(student, teacher, batch, kind: str, cosine_weight: float = 1.0):
    torch = require("torch")
    f = torch.nn.functional
    if kind == "logits":
        s = student(**batch, use_cache=False).logits
        with torch.no_grad():
            t = teacher(**batch, use_cache=False).logits
        return f.kl_div(f.log_softmax(s, -1), f.log_softmax(t, -1), log_target=True, reduction="batchmean") / s.shape[1]
    s = student(**batch, output_hidden_states=True).hidden_states[1:]
    with torch.no_grad():
        t = teacher(**batch, output_hidden_states=True).hidden_states[1:]
    mask = batch["attention_mask"].unsqueeze(-1).to(s[0].dtype)  # [B, S, 1]
    per_layer = [(((a - b) * mask) ** 2).sum() / (mask.sum() * a.shape[-1]) / b.var() for a, b in zip(s, t)]
    # plus 1 - cosine of the mean-pooled sentence embeddings: what an encoder is used for
    pooled_s, pooled_t = ((x * mask).sum(1) / mask.sum(1) for x in (s[-1], t[-1]))  # [B, H]
    cosine = f.cosine_similarity(pooled_s, pooled_t, dim=-1).mean()
    return torch.stack(per_layer).mean() + cosine_weight * (1.0 - cosine)


def _fraction_done(config: FinetuneConfig, step: int, elapsed_s: float) -> float:
    """How far the run is, 0..1: by steps, or by time when a budget is set, whichever is further."""
    done = step / config.steps if config.steps else 1.0
    if config.time_budget_s is not None:
        done = max(done, elapsed_s / config.time_budget_s)
    return done


def lr_factor(step: int, done: float) -> float:
    """Learning-rate multiplier: 10 warm-up steps, then a linear decay to zero at the end of the run."""
    return min(1.0, (step + 1) / 10) * max(0.0, 1.0 - done)


def distill_(student, teacher, batches: Iterator[dict], kind: str, config: FinetuneConfig = FinetuneConfig(),
             progress: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
    """Fine-tune `student` (pruned, masks on) towards `teacher` in place; returns a manifest section."""
    torch = require("torch", "fine-tuning")
    loss_kind = config.loss if config.loss != "auto" else ("logits" if kind == "decoder" else "hidden")
    torch.manual_seed(config.seed)
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    params = []
    for m in student.modules():
        for p in m.parameters(recurse=False):
            p.requires_grad_(False)
    for m in student.modules():
        if isinstance(m, torch.nn.LayerNorm) or (isinstance(m, torch.nn.Linear) and m.in_features % 4 == 0) \
                or (config.train_embeddings and isinstance(m, torch.nn.Embedding)):
            for p in m.parameters():  # parametrized weights expose `original` here
                if p.data_ptr() not in {q.data_ptr() for q in params}:
                    p.requires_grad_(True)
                    params.append(p)
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    student.eval()  # dropout off: the target is the teacher's deterministic output
    device = next(student.parameters()).device
    losses, started = [], time.time()
    step = 0
    while (done := _fraction_done(config, step, time.time() - started)) < 1.0:
        for group in opt.param_groups:
            group["lr"] = config.lr * lr_factor(step, done)
        if step == WARMUP_STEPS:
            warm = time.time()
        if config.time_budget_s is not None and step == WARMUP_STEPS + 20:  # an estimate, for the log only
            per_step = max((time.time() - warm) / 20, 1e-9)
            left = int((config.time_budget_s - (time.time() - started)) / per_step)
            progress(f"{per_step * 1e3:.0f} ms/step: about {min(config.steps, step + left)} steps fit the "
                     f"{config.time_budget_s:.0f} s budget")
        batch = {k: v.to(device) for k, v in next(batches).items()}  # to wherever the student lives
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.bf16):
            loss = _loss(student, teacher, batch, loss_kind, config.cosine_weight).float()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 100 == 0:
            progress(f"step {step + 1} ({done:.0%}) loss {losses[-1]:.4g}")
        step += 1
    progress(f"step {step} (done) loss {losses[-1]:.4g}" if losses else "no fine-tuning steps")
    student.eval()
    for p in params:
        p.requires_grad_(False)
    return {"config": asdict(config), "loss": loss_kind, "steps_run": step, "trained_tensors": len(params),
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "seconds": round(time.time() - started, 1)}
