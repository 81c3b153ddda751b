"""2:4 structured sparsity for Linear weights: masks along K, kept through fine-tuning and QAT.

`sparsify_(model, config)` prunes, in place, every eligible `nn.Linear` to two non-zeros in every four
consecutive weights along the reduction axis K (`in_features`), where the config's policy says to. The
mask is a `torch.nn.utils.parametrize` parametrization on `Linear.weight`: every reader of
`module.weight` (forward, fake quantizers of QAT, export) sees the masked weight, and the masked entries
get zero gradient (two_four.py). `strip_masks` bakes the masks in (for export). Layers are skipped, never silently:
K % 4 != 0, a weight tied to an embedding, a name in `config.skip`, or (policy "speed") a shape where the
target does not gain. The returned `SparsityReport` is the manifest section.
"""

from __future__ import annotations

import fnmatch
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgeattn.errors import ConfigError
from edgeattn.optional import require
from edgeattn.quantize.progress import StepProgress
from edgeattn.quantize.sparsity.calibrate import collect_grams, prune_layer_
from edgeattn.quantize.sparsity.permute import apply_pair_permutations, search_permutation
from edgeattn.quantize.sparsity.sequential import prune_sequential_
from edgeattn.quantize.sparsity.speed import load_table
from edgeattn.quantize.sparsity.two_four import (apply_mask_, has_mask, is_two_four, kept_magnitude, masked_layers,
                                                 strip_masks, two_four_mask)  # masked_layers, strip_masks: this module's too

POLICIES = ("all", "speed")
METHODS = ("magnitude", "calibrated", "sequential")
GEMM_DTYPES = ("fp16", "int8")
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SparsityConfig:
    """What to prune and how. `policy`: all = every eligible Linear; speed = only where the speed table
    (or, without a measurement, the size rule) says the target's sparse GEMM beats the dense one."""

    policy: str = "all"
    method: str = "magnitude"  # magnitude: top-2 |w|; calibrated: OBS saliency with error compensation;
    # sequential: calibrated, block by block, each layer on the inputs of the already-pruned model
    tokens: int = 2048  # M = batch * sequence used to look the speed table up
    gemm_dtype: str = "int8"  # precision the target runs the GEMMs in (int8 after W8A8 QAT)
    min_speedup: float = 1.05  # prune only when sparse is at least this much faster
    permute: bool = False  # search an input-channel permutation that keeps more magnitude
    permute_iters: int = 400  # group-pair swap trials per layer
    skip: tuple[str, ...] = ()  # fnmatch patterns of module names never pruned
    speed_table: str | None = None  # a JSON written by benchmarks/sparse_speed_h200.py; None = packaged
    version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"policy: expected one of {', '.join(POLICIES)}, found {self.policy!r}")
        if self.method not in METHODS:
            raise ConfigError(f"method: expected one of {', '.join(METHODS)}, found {self.method!r}")
        if self.gemm_dtype not in GEMM_DTYPES:
            raise ConfigError(f"gemm_dtype: expected one of {', '.join(GEMM_DTYPES)}, found {self.gemm_dtype!r}")
        if self.tokens < 1:
            raise ConfigError(f"tokens: expected >= 1, found {self.tokens}")
        if not self.min_speedup > 0:
            raise ConfigError(f"min_speedup: expected > 0, found {self.min_speedup}")
        if self.permute_iters < 0:
            raise ConfigError(f"permute_iters: expected >= 0, found {self.permute_iters}")
        if self.speed_table is not None and not Path(self.speed_table).is_file():
            raise ConfigError(f"speed_table: expected a JSON file, found no file at {self.speed_table}")

    def as_dict(self) -> dict[str, Any]:
        return {"type": "SparsityConfig", **asdict(self), "skip": list(self.skip)}


@dataclass
class LayerDecision:
    name: str
    out_features: int
    in_features: int
    pruned: bool
    reason: str
    basis: str  # "policy all", "measured table", "size rule", or why it was not eligible
    kept_magnitude: float | None = None  # share of sum |w| kept by the 2:4 mask
    kept_magnitude_permuted: float | None = None  # same, after the channel permutation search
    permutation_applied: bool = False  # True when the producer and consumer were permuted in the model
    speedup: float | None = None


@dataclass
class SparsityReport:
    config: dict[str, Any]
    layers: list[LayerDecision] = field(default_factory=list)

    @property
    def pruned(self) -> list[str]:
        return [d.name for d in self.layers if d.pruned]

    @property
    def skipped(self) -> list[LayerDecision]:
        return [d for d in self.layers if not d.pruned]

    def as_dict(self) -> dict[str, Any]:
        return {"config": self.config, "pruned": self.pruned,
                "skipped": {d.name: d.reason for d in self.skipped},
                "layers": [asdict(d) for d in self.layers]}


def _tied_weights(model) -> set[int]:
    torch = require("torch")
    return {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}


def _eligibility(name: str, linear, tied: set[int], config: SparsityConfig) -> str | None:
    """Why a Linear cannot or must not be pruned, or None."""
    if any(fnmatch.fnmatch(name, p) for p in config.skip):
        return "skipped by config.skip"
    if has_mask(linear):
        return None
    if id(linear.weight) in tied:
        return "weight tied to an input embedding (pruning it would prune the embedding)"
    if linear.in_features % 4:
        return f"K = in_features = {linear.in_features} is not a multiple of 4"
    return None


def sparsify_(model, config: SparsityConfig = SparsityConfig(), *, calibration=None,
              progress=lambda msg: None) -> SparsityReport:
    """Prune the model's Linear layers to 2:4 along K, in place; returns what was done per layer.

    `calibration` (an iterable of model input dicts) is needed by methods "calibrated" and "sequential".
    `progress` gets a line before calibration and a `StepProgress` after each layer is pruned.
    """
    torch = require("torch", "2:4 sparsity")
    if config.method in ("calibrated", "sequential") and calibration is None:
        raise ConfigError(f"method {config.method!r} needs calibration batches (e.g. --calib TEXTFILE)")
    table = load_table(config.speed_table) if config.policy == "speed" else None
    chosen = {}
    report = SparsityReport(config.as_dict())
    tied = _tied_weights(model)
    applied = apply_pair_permutations(model, config) if config.permute else {}
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            d = LayerDecision(name, module.out_features, module.in_features, False, "", "")
            report.layers.append(d)
            why = _eligibility(name, module, tied, config)
            if why is not None:
                d.reason, d.basis = why, "not eligible"
                continue
            weight = module.weight.detach()
            d.kept_magnitude = kept_magnitude(weight)
            if name in applied:
                d.kept_magnitude, d.kept_magnitude_permuted = applied[name]
                d.permutation_applied = True
            elif config.permute:
                d.kept_magnitude_permuted = kept_magnitude(weight[:, search_permutation(weight, config.permute_iters)])
            if table is None:
                d.basis, d.reason = "policy all", "every eligible Linear is pruned"
            else:
                verdict = table.decide(module.out_features, module.in_features, config.tokens,
                                       config.gemm_dtype, config.min_speedup)
                d.basis, d.speedup, d.reason = verdict.basis, verdict.speedup, verdict.reason
                if not verdict.gains:
                    continue
            chosen[name] = module
            d.pruned = True
        if config.method == "sequential" and chosen:
            prune_sequential_(model, chosen, calibration, progress)
            return report
        grams = {}
        if config.method == "calibrated" and chosen:
            progress(f"collecting input statistics of {len(chosen)} layers")
            grams = collect_grams(model, chosen, calibration)
        started = time.time()
        for i, (name, module) in enumerate(chosen.items(), 1):
            if name in grams:
                prune_layer_(module, grams.pop(name))
            else:
                apply_mask_(module, two_four_mask(module.weight.detach()))
            progress(StepProgress("pruning", i, len(chosen), time.time() - started, unit="layer"))
    return report


def reapply_existing_masks_(model) -> list[str]:
    """Mask every Linear whose weight is already 2:4 (a pruned checkpoint reloaded), so that later
    fine-tuning or QAT keeps its zeros. Returns the names."""
    torch = require("torch", "2:4 sparsity")
    names = []
    for name, module in model.named_modules():
        if (isinstance(module, torch.nn.Linear) and not has_mask(module) and module.in_features % 4 == 0
                and is_two_four(module.weight.detach())):
            apply_mask_(module, module.weight.detach() != 0)
            names.append(name)
    return names
