"""`edgeattn sparsify`: HF model -> 2:4 pruned (where it pays), fine-tuned with masks -> ONNX + manifest.

The exported ONNX carries the pruned layer names in its metadata (`edgeattn.sparse_layers`), so
`edgeattn check-sparsity` and the build's check-sparsity pass know which weights must be 2:4. A JSON
manifest section is written beside it (`OUT.sparsity.json`).
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from edgeattn.errors import ConfigError
from edgeattn.optional import require
from edgeattn.quantize.sparsity.masks import SparsityConfig
from edgeattn.quantize.sparsity.finetune import FinetuneConfig

SIDECAR_SUFFIX = ".sparsity.json"


@dataclass(frozen=True)
class SparsifyJob:
    sparsity: SparsityConfig = SparsityConfig()
    finetune: FinetuneConfig = FinetuneConfig(steps=0)
    calib: str | None = None  # text file, one document a line; None = gensim's lee_background
    calib_batches: int = 8  # batches for calibrated masks
    save_hf: str | None = None  # also save the pruned checkpoint (for `edgeattn quantize`, which keeps the zeros)
    export: dict[str, Any] = field(default_factory=dict)  # ExportConfig fields
    qat: str | None = None  # then QAT with edgeattn.quantize (w8a8, w4, fp8), masks kept; Q/DQ export
    qat_steps: int = 0
    device: str = "cpu"  # where pruning and fine-tuning run (cpu, cuda, cuda:N); export runs on the CPU

    def __post_init__(self) -> None:
        if not (self.device == "cpu" or self.device == "cuda" or
                (self.device.startswith("cuda:") and self.device[5:].isdigit())):
            raise ConfigError(f"device: expected cpu, cuda or cuda:N, found {self.device!r}")
        if self.calib_batches < 1:
            raise ConfigError(f"calib_batches: expected >= 1, found {self.calib_batches}")
        if self.qat_steps < 0:
            raise ConfigError(f"qat_steps: expected >= 0, found {self.qat_steps}")


def add_sparse_metadata(onnx_path: Path, layers: list[str], decisions: dict[str, dict] | None = None) -> None:
    """Record the pruned layer names (and the per-layer decisions) in the ONNX metadata, atomically."""
    import onnx

    from edgeattn import atomic
    from edgeattn.passes.check_sparsity import DECISIONS_KEY, METADATA_KEY

    model = onnx.load(str(onnx_path))
    kept = [p for p in model.metadata_props if p.key not in (METADATA_KEY, DECISIONS_KEY)]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=METADATA_KEY, value=json.dumps(layers))
    if decisions:
        model.metadata_props.add(key=DECISIONS_KEY, value=json.dumps(decisions))
    atomic.write_bytes(onnx_path, model.SerializeToString())


def decisions_of(report) -> dict[str, dict]:
    """Compact per-layer decisions for the ONNX metadata (and so for the build manifest)."""
    return {d.name: {"pruned": d.pruned, "basis": d.basis, "reason": d.reason} for d in report.layers}


def export_masked(model, kind: str, out: Path, layers: list[str], export: dict[str, Any],
                  decisions: dict[str, dict] | None = None) -> Path:
    """Export a copy whose masks are baked in (the constants are the masked weights)."""
    from edgeattn.export import ExportConfig, export_module
    from edgeattn.quantize.sparsity.masks import strip_masks

    path = export_module(strip_masks(model), kind, out, ExportConfig(**export))
    add_sparse_metadata(path, layers, decisions)
    return path


def run_sparsify(model_name: str, out: str | Path, job: SparsifyJob = SparsifyJob(),
                 progress: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
    """Load, prune, fine-tune, export; returns the manifest section (also written beside `out`)."""
    from edgeattn import atomic, hf_models
    from edgeattn.quantize.sparsity.masks import sparsify_
    from edgeattn.quantize.sparsity.finetune import distill_, read_texts, text_batches

    out = Path(out)
    if job.device != "cpu" and not require("torch", "sparsify on a GPU").cuda.is_available():
        raise ConfigError(f"device {job.device}: expected a CUDA device, found none (torch.cuda.is_available() is False)")
    model, tok, kind = hf_models.load(model_name)
    teacher = copy.deepcopy(model) if job.finetune.steps or job.qat else None
    calibration = None
    calibrated = job.sparsity.method in ("calibrated", "sequential")
    if calibrated or job.finetune.steps or job.qat:
        texts = read_texts(job.calib)
    if calibrated:
        batches = text_batches(tok, texts, kind, FinetuneConfig(batch=8, seq_len=job.finetune.seq_len, seed=1,
                                                                length_grouping=job.finetune.length_grouping))
        calibration = [next(batches) for _ in range(job.calib_batches)]
    for m in (model, teacher):
        if m is not None:
            m.to(job.device)
    progress(f"pruning ({job.sparsity.policy}, {job.sparsity.method}) on {job.device}")
    report = sparsify_(model, job.sparsity, calibration=calibration)
    section: dict[str, Any] = {"model": str(model_name), "kind": kind, "sparsity": report.as_dict(),
                               "basis": sorted({d.basis for d in report.layers if d.pruned or d.basis != "not eligible"}),
                               "calib": job.calib or "gensim lee_background"}
    if job.finetune.steps and report.pruned:
        progress(f"fine-tuning {job.finetune.steps} steps with the masks on")
        section["finetune"] = distill_(model, teacher, text_batches(tok, texts, kind, job.finetune), kind,
                                       job.finetune, progress)
    model.cpu()  # export, saving and QAT calibration run on the CPU (QAT's distillation picks CUDA itself)
    if teacher is not None:
        teacher.cpu()
    if job.save_hf:
        from edgeattn.quantize.sparsity.masks import strip_masks

        with atomic.directory(Path(job.save_hf)) as staging:
            strip_masks(model).save_pretrained(staging)
            tok.save_pretrained(staging)
        section["saved_hf"] = str(job.save_hf)
    progress(f"exporting {out}")
    if job.qat:
        from edgeattn.quantize.config import config_from_name
        from edgeattn.quantize.sparsity.qat import export_sparse_qdq, qat_after_sparsity

        progress(f"QAT {job.qat}, {job.qat_steps} steps, masks kept")
        section["qat"] = qat_after_sparsity(model, teacher, tok, kind, texts, job.qat_steps,
                                            config=config_from_name(job.qat))
        section["qdq"] = export_sparse_qdq(model, kind, out, report.pruned, decisions_of(report))
    else:
        export_masked(model, kind, out, report.pruned, job.export, decisions_of(report))
    section["onnx"] = str(out)
    section["job"] = {"finetune": asdict(job.finetune), "calib_batches": job.calib_batches, "device": job.device}
    atomic.write_text(out.with_name(out.name + SIDECAR_SUFFIX), json.dumps(section, indent=1))
    return section
