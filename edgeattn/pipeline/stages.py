"""The stage kinds of a recipe: each reads its options into the config of an existing stage function and
runs that function into a staging folder. Nothing here trains, exports or builds by itself.

kind            reads   writes                      calls
export          hf      model.onnx                  edgeattn.export.export_hf
sparsify        hf      model.onnx (+ hf/)          edgeattn.quantize.sparsity.pipeline.run_sparsify
quantize        hf      model.onnx                  edgeattn.quantize.pipeline.run_quantize
build           onnx    bundle/                     edgeattn.bundle.build.build
export-triton   bundle  repo/                       edgeattn.tritonserver.repository.export_triton
"""

from __future__ import annotations

import dataclasses
import importlib.util
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from edgeattn.errors import ConfigError, InputError, TargetError
from edgeattn.pipeline.tables import convert, from_table, option_names, resolve_path

Progress = Callable[[str], None]


def quant_precision(name: str | None) -> str | None:
    """The weight format a registered quantization config leaves in the graph (int8, int4, fp8)."""
    from edgeattn.quantize.config import CONFIGS

    return CONFIGS[name].weight_format if name in CONFIGS else None


@dataclass(frozen=True)
class Parsed:
    """A stage's options, validated: the config its function takes, and what the pipeline needs to know."""

    job: Any
    files: tuple[tuple[str, Path], ...] = ()  # (option, file the stage reads): hashed into its key
    model: str | Path | None = None  # the external input (option `model` / `bundle`); None: an earlier stage
    precision: str | None = None  # quantized precision the stage leaves in the graph (int8, int4, fp8)
    writes: tuple[tuple[str, str], ...] = ()  # (artifact, path inside the stage folder)


@dataclass(frozen=True)
class Run:
    """What a stage function gets: where its input is, where to write, and the chain so far."""

    source: str | Path  # an alias or a path: the input artifact
    staging: Path  # empty folder; renamed to the stage folder when the stage succeeds
    progress: Progress
    chain: tuple[dict, ...] = field(default=())  # records of the stages this one descends from, its own last


def _files(job, keys: tuple[str, ...]) -> tuple[tuple[str, Path], ...]:
    out = []
    for dotted in keys:
        value = job
        for part in dotted.split("."):
            value = getattr(value, part, None)
        if value is not None:
            out.append((dotted, Path(value)))
    return tuple(out)


def _split_input(options: dict, key: str, where: str, base: Path, alias_ok: bool) -> tuple[dict, str | Path | None]:
    options = dict(options)
    value = options.pop(key, None)
    if value is None:
        return options, None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: {key}: expected a path{' or a packaged alias' if alias_ok else ''}, "
                          f"found {value!r}")
    if alias_ok:
        from edgeattn.hf_models import PACKAGED

        if value in PACKAGED:
            if importlib.util.find_spec(PACKAGED[value].module) is None:
                raise InputError(f"{where}: {key}: the packaged model {value!r} needs {PACKAGED[value].package}: "
                                 f"{PACKAGED[value].install}")
            return options, value
    path = resolve_path(value, base)
    if not path.exists():
        raise InputError(f"{where}: {key}: expected an existing {'alias or ' if alias_ok else ''}path, "
                         f"found nothing at {path}")
    return options, path


class StageKind:
    """A stage kind: the artifact it reads, the option that names an external input instead of an earlier stage,
    and whether that input may be a packaged model alias. Subclasses parse options and run the parsed job."""

    kind: str
    reads: str
    input_option: str
    alias_ok: bool

    def __init_subclass__(cls, *, kind: str, reads: str, input_option: str, alias_ok: bool = False, **kw):
        super().__init_subclass__(**kw)
        cls.kind, cls.reads, cls.input_option, cls.alias_ok = kind, reads, input_option, alias_ok

    def split_input(self, options: dict, where: str, base: Path) -> tuple[dict, str | Path | None]:
        """The options without the input option, and that input (a path or an alias; None: an earlier stage)."""
        return _split_input(options, self.input_option, where, base, self.alias_ok)


class ExportStage(StageKind, kind="export", reads="hf", input_option="model", alias_ok=True):

    def parse(self, options: dict, where: str, base: Path) -> Parsed:
        from edgeattn.export import ExportConfig

        options, model = self.split_input(options, where, base)
        return Parsed(from_table(ExportConfig, options, where, base), model=model, writes=(("onnx", "model.onnx"),))

    def run(self, parsed: Parsed, run: Run) -> dict:
        from edgeattn.export import export_hf

        run.progress(f"exporting {run.source} ({parsed.job.exporter})")
        export_hf(run.source, run.staging / "model.onnx", parsed.job)
        return {"exporter": parsed.job.exporter, "attention": parsed.job.attention}


class SparsifyStage(StageKind, kind="sparsify", reads="hf", input_option="model", alias_ok=True):
    FILES = ("calib", "sparsity.speed_table")

    def parse(self, options: dict, where: str, base: Path) -> Parsed:
        from edgeattn.quantize.sparsity.pipeline import SparsifyJob

        options, model = self.split_input(options, where, base)
        save_hf = convert(bool, options.pop("save_hf", False), f"{where}: save_hf", base)
        for key in ("calib",):  # str fields that name files: relative to the recipe
            if isinstance(options.get(key), str):
                options[key] = str(_existing(options[key], base, f"{where}: {key}"))
        if isinstance(options.get("sparsity"), dict) and isinstance(options["sparsity"].get("speed_table"), str):
            options["sparsity"] = {**options["sparsity"], "speed_table": str(
                _existing(options["sparsity"]["speed_table"], base, f"{where}: sparsity.speed_table"))}
        job = from_table(SparsifyJob, options, where, base, refused=("save_hf",))
        writes = (("onnx", "model.onnx"),) + ((("hf", "hf"),) if save_hf else ())
        return Parsed(job, _files(job, self.FILES), model, quant_precision(job.qat), writes)

    def run(self, parsed: Parsed, run: Run) -> dict:
        from edgeattn.quantize.sparsity.pipeline import run_sparsify

        job = parsed.job
        if dict(parsed.writes).get("hf"):
            job = dataclasses.replace(job, save_hf=str(run.staging / "hf"))
        section = run_sparsify(run.source, run.staging / "model.onnx", job, progress=run.progress)
        summary = {"pruned": len(section["sparsity"]["pruned"]), "layers": len(section["sparsity"]["layers"])}
        if section.get("fidelity"):
            summary["fidelity"] = section["fidelity"]
        if "qat" in section:
            summary.update(qat=job.qat, qat_loss_last=section["qat"].get("loss_last"),
                           masks_kept=section["qat"].get("masks_kept"))
        return summary


class QuantizeStage(StageKind, kind="quantize", reads="hf", input_option="model", alias_ok=True):

    def parse(self, options: dict, where: str, base: Path) -> Parsed:
        from edgeattn.quantize.config import CONFIGS
        from edgeattn.quantize.pipeline import QuantizeJob

        options, model = self.split_input(options, where, base)
        name = options.pop("config", None)
        if name not in CONFIGS:
            raise ConfigError(f"{where}: config: expected one of {', '.join(CONFIGS)}, found {name!r}")
        quant_keys = [k for k in option_names(CONFIGS[name]) if k != "overrides"]
        quant = {k: options.pop(k) for k in list(options) if k in quant_keys and k not in option_names(QuantizeJob)}
        config = from_table(CONFIGS[name], quant, f"{where} (config {name})", base)
        texts, files = (), ()
        if "calib" in options:
            from edgeattn.text import read_lines

            calib = _existing(options.pop("calib"), base, f"{where}: calib")
            try:
                texts = tuple(read_lines(calib))
            except InputError as exc:
                raise InputError(f"{where}: calib: {exc}") from None
            files = (("calib", calib),)
        try:
            job = from_table(QuantizeJob, options, where, base, refused=("model", "config", "out", "texts", "extra"),
                             fixed={"model": str(model or "<input>"), "config": config, "out": Path("model.onnx"),
                                    "texts": texts})
        except ConfigError as exc:
            if "unknown option" in str(exc):
                raise ConfigError(f"{exc}, calib, config, or a {name} config option "
                                  f"({', '.join(quant_keys)})") from None
            raise
        return Parsed(job, files, model, quant_precision(name), (("onnx", "model.onnx"),))

    def run(self, parsed: Parsed, run: Run) -> dict:
        from edgeattn.quantize.pipeline import run_quantize

        job = dataclasses.replace(parsed.job, model=str(run.source), out=run.staging / "model.onnx")
        section = run_quantize(job, progress=run.progress).section
        onnx = section.get("onnx") or {}
        return {"config": section["config"].get("name", job.config.name), "steps": section["steps"],
                "loss_last": section["loss_last"], "quantized_matmuls": onnx.get("quantized_matmuls"),
                "fidelity": section.get("fidelity")}


class BuildStage(StageKind, kind="build", reads="onnx", input_option="model"):

    def parse(self, options: dict, where: str, base: Path) -> Parsed:
        from edgeattn.bundle.build import BuildConfig
        from edgeattn.targets import resolve_target

        options, model = self.split_input(options, where, base)
        job = from_table(BuildConfig, options, where, base, refused=("out",))
        try:
            target, _ = resolve_target(job.target)
        except TargetError as exc:
            raise TargetError(f"{where}: target: {exc}") from None
        try:
            target.require_precision(job.precision)
        except TargetError as exc:
            raise TargetError(f"{where}: precision: {exc}") from None
        return Parsed(job, model=model, writes=(("bundle", "bundle"),))

    def run(self, parsed: Parsed, run: Run) -> dict:
        from edgeattn.bundle.build import build

        job = dataclasses.replace(parsed.job, out=run.staging / "bundle")
        bundle = build(run.source, job, progress=run.progress, sections={"pipeline": list(run.chain)})
        m = bundle.manifest
        parity = m.sections.get("parity", {})
        return {"target": m.target["name"], "artifact": m.artifact, "parity": parity.get("status"),
                "max_abs_diff": parity.get("max_abs_diff"), "problems": len(m.sections.get("problems", []))}

    @staticmethod
    def missing_toolchain(job) -> str | None:
        """Why this machine cannot build for the stage's target, or None when it can."""
        from edgeattn.optional import available
        from edgeattn.targets import detect_gpu, resolve_target

        target, _ = resolve_target(job.target)
        if target.backend == "tensorrt_rtx" and not available("tensorrt_rtx"):
            return f"target {target.name} needs TensorRT for RTX (pip install 'edgeattn[rtx]'), not installed here"
        if target.backend == "tensorrt":
            if not available("tensorrt"):
                return f"target {target.name} needs TensorRT, not installed here"
            if not target.builds_on_host and platform.machine() != "aarch64":
                return f"target {target.name}: Jetson engines are built on the Jetson, this is a {platform.machine()} host"
            if detect_gpu() is None:
                return f"target {target.name}: TensorRT needs a GPU to build, found none"
        return None


class ExportTritonStage(StageKind, kind="export-triton", reads="bundle", input_option="bundle"):

    def parse(self, options: dict, where: str, base: Path) -> Parsed:
        from edgeattn.tritonserver.repository import TritonConfig

        options, bundle = self.split_input(options, where, base)
        job = from_table(TritonConfig, options, where, base)
        return Parsed(job, _files(job, ("plugin_library",)), bundle, writes=(("repo", "repo"),))

    def run(self, parsed: Parsed, run: Run) -> dict:
        from edgeattn.tritonserver.repository import export_triton

        run.progress(f"model repository for {Path(run.source).name}")
        folder = export_triton(run.source, run.staging / "repo", parsed.job)
        return {"model": folder.name}


KINDS: dict[str, Any] = {k.kind: k for k in (ExportStage(), SparsifyStage(), QuantizeStage(), BuildStage(),
                                              ExportTritonStage())}


def _existing(value, base: Path, where: str) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a path (a string), found {value!r}")
    path = resolve_path(value, base)
    if not path.is_file():
        raise InputError(f"{where}: expected a file, found nothing at {path}")
    return path

