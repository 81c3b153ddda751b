"""A recipe file -> a validated, frozen plan of stages. Everything is checked here, before any stage runs:
unknown stages and options, option values (by the stage's own config), inputs that no stage writes,
targets, and precisions a target refuses (asked for, or carried by a quantized model).

    [pipeline]
    name = "minilm-2to4-w8a8"          # bundles get this model name
    work_dir = "minilm.pipeline"       # default: <recipe stem>.pipeline beside the recipe
    expect_cos_mean = 0.963            # optional: the fidelity a documented run of it reached (the run's
                                       # summary warns when a stage lands far below; decoders:
                                       # expect_ppl_increase_pct)

    [[stage]]
    kind = "sparsify"                  # export | sparsify | quantize | build | export-triton
    name = "sparsify"                  # default: the kind; a folder of the work dir
    model = "minilm"                   # first stages: an alias or a folder; later ones read an earlier stage
    qat = "w8a8"
    [stage.finetune]
    steps = 150

    [[stage]]
    kind = "build"
    targets = ["cpu", "rtx"]           # one build stage per target: build-cpu, build-rtx
    input = "sparsify"                 # default: the closest earlier stage that writes what this one reads
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgeattn.errors import BundleError, ConfigError, InputError, TargetError
from edgeattn.pipeline.stages import KINDS, BuildStage, Parsed
from edgeattn.pipeline.summary import EXPECT_KEYS
from edgeattn.pipeline.tables import check_keys, resolve_path
from edgeattn.targets import resolve_target

PIPELINE_KEYS = ("name", "work_dir") + EXPECT_KEYS
COMMON_KEYS = ("kind", "name", "input", "optional", "targets")


@dataclass(frozen=True)
class Stage:
    name: str
    kind: str
    options: dict[str, Any]  # the stage's options as the recipe gives them (its key hashes these)
    parsed: Parsed
    input: str | None  # the earlier stage it reads; None when it reads `parsed.model`
    optional: bool = False
    skip: str | None = None  # why it will not run on this machine (an optional stage, or one after it)
    where: str = ""

    @property
    def reads(self) -> str:
        return KINDS[self.kind].reads


@dataclass(frozen=True)
class Recipe:
    path: Path
    name: str
    work_dir: Path
    stages: tuple[Stage, ...]
    notes: tuple[str, ...] = ()  # things worth knowing that are not errors
    expect: tuple[tuple[str, float], ...] = ()  # (expect_cos_mean | expect_ppl_increase_pct, value)

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise ConfigError(f"{self.path.name}: no stage named {name!r}: expected one of "
                          f"{', '.join(s.name for s in self.stages)}")

    def ancestors(self, stage: Stage) -> list[Stage]:
        """The stages `stage` descends from, first first (not itself)."""
        chain = []
        while stage.input is not None:
            stage = self.stage(stage.input)
            chain.append(stage)
        return chain[::-1]


def load(path: str | Path, *, work_dir: str | Path | None = None, base: Path | None = None) -> Recipe:
    """Read and validate a recipe. Relative paths in it are relative to `base` (default: its folder)."""
    path = Path(path)
    base = Path(base) if base is not None else path.resolve().parent
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"recipe {path}: expected a readable TOML file ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path.name}: not valid TOML: {exc}") from None
    check_keys(data, ("pipeline", "stage"), path.name)
    head = data.get("pipeline", {})
    if not isinstance(head, dict):
        raise ConfigError(f"{path.name}: [pipeline]: expected a table, found {head!r}")
    check_keys(head, PIPELINE_KEYS, f"{path.name}: [pipeline]")
    name = _name(head.get("name", path.stem), f"{path.name}: [pipeline] name")
    if work_dir is None:
        work_dir = resolve_path(head["work_dir"], base) if "work_dir" in head else base / f"{path.stem}.pipeline"
    tables = data.get("stage", [])
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"{path.name}: expected at least one [[stage]] table, found none")
    stages: list[Stage] = []
    for i, table in enumerate(tables, 1):
        for expanded in _expand(table, f"{path.name}: [[stage]] {i}"):
            stages.append(_stage(expanded, stages, path.name, base, name))
    notes = tuple(_notes(stages))
    return Recipe(path, name, Path(work_dir), tuple(stages), notes, _expect(head, path.name))


def _expect(head: dict, file: str) -> tuple[tuple[str, float], ...]:
    out = []
    for key in EXPECT_KEYS:
        if key not in head:
            continue
        value = head[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{file}: [pipeline] {key}: expected a number, found {value!r}")
        if key == "expect_cos_mean" and not -1.0 <= value <= 1.0:
            raise ConfigError(f"{file}: [pipeline] {key}: expected a cosine in [-1, 1], found {value!r}")
        out.append((key, float(value)))
    return tuple(out)


def _expand(table: Any, where: str) -> list[dict]:
    """A build table with `targets = [...]` becomes one build table per target."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table, found {table!r}")
    kind = table.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind: expected one of {', '.join(KINDS)}, found {kind!r}")
    if "targets" not in table:
        return [table]
    targets = table["targets"]
    if kind != "build":
        raise ConfigError(f"{where}: targets: only build stages have targets, found it in a {kind} stage")
    if "target" in table:
        raise ConfigError(f"{where}: give target or targets, found both")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise ConfigError(f"{where}: targets: expected a non-empty array of target names, found {targets!r}")
    rest = {k: v for k, v in table.items() if k != "targets"}
    stem = rest.pop("name", "build")
    return [{**rest, "name": f"{stem}-{t}", "target": t} for t in targets]


def _stage(table: dict, earlier: list[Stage], file: str, base: Path, pipeline_name: str) -> Stage:
    kind = KINDS[table["kind"]]
    name = _name(table.get("name", table["kind"]), f"{file}: stage name")
    where = f"{file}: stage {name!r} ({kind.kind})"
    if any(s.name == name for s in earlier):
        raise ConfigError(f"{where}: name: expected a name no other stage has, found a second {name!r}")
    optional = table.get("optional", False)
    if not isinstance(optional, bool):
        raise ConfigError(f"{where}: optional: expected true or false, found {optional!r}")
    if optional and kind.kind != "build":
        raise ConfigError(f"{where}: optional: only build stages can be optional (skipped without their toolchain)")
    options = {k: v for k, v in table.items() if k not in COMMON_KEYS}
    if kind.kind == "build":
        options.setdefault("name", pipeline_name)  # the bundle's model name
    parsed = kind.parse(options, where, base)
    source = _input(table, parsed, earlier, where, kind)
    stage = Stage(name, kind.kind, options, parsed, source, optional, None, where)
    return _check_build(stage, earlier) if kind.kind == "build" else _inherit_skip(stage, earlier)


def _input(table: dict, parsed: Parsed, earlier: list[Stage], where: str, kind) -> str | None:
    if parsed.model is not None:
        if "input" in table:
            raise ConfigError(f"{where}: give input or {kind.input_option}, found both")
        return None
    if "input" in table:
        wanted = table["input"]
        found = next((s for s in earlier if s.name == wanted), None)
        if found is None:
            raise ConfigError(f"{where}: input: expected the name of an earlier stage "
                              f"({', '.join(s.name for s in earlier) or 'there is none'}), found {wanted!r}")
        if kind.reads not in dict(found.parsed.writes):
            hint = " (set save_hf = true in it)" if found.kind == "sparsify" and kind.reads == "hf" else ""
            raise ConfigError(f"{where}: input: stage {wanted!r} ({found.kind}) writes "
                              f"{', '.join(dict(found.parsed.writes))}, this stage reads {kind.reads}{hint}")
        return wanted
    for s in reversed(earlier):
        if kind.reads in dict(s.parsed.writes):
            return s.name
    raise InputError(f"{where}: its input is missing: expected {kind.input_option} = ... or an earlier stage "
                     f"that writes {kind.reads}")


def _inherit_skip(stage: Stage, earlier: list[Stage]) -> Stage:
    up = next((s for s in earlier if s.name == stage.input), None)
    if up is not None and up.skip:
        return replace(stage, skip=f"its input {up.name} is skipped")
    return stage


def _check_build(stage: Stage, earlier: list[Stage]) -> Stage:
    target, _ = resolve_target(stage.parsed.job.target)
    by_name = {s.name: s for s in earlier}
    up = by_name.get(stage.input)
    while up is not None:
        if up.parsed.precision:
            try:
                target.require_precision(up.parsed.precision)
            except TargetError as exc:
                raise TargetError(f"{stage.where}: target: the model carries {up.parsed.precision} from stage "
                                  f"{up.name!r} ({up.kind}): {exc}") from None
            break
        up = by_name.get(up.input)
    stage = _inherit_skip(stage, earlier)
    missing = BuildStage.missing_toolchain(stage.parsed.job)
    if missing and stage.skip is None:
        if not stage.optional:
            raise TargetError(f"{stage.where}: target: {missing}; mark the stage optional = true to skip it "
                              f"where its toolchain is absent")
        return replace(stage, skip=missing)
    return stage


def _notes(stages: list[Stage]) -> list[str]:
    by_name = {s.name: s for s in stages}
    out = []
    for s in stages:
        up = by_name.get(s.input)
        if s.kind == "quantize" and up is not None and up.kind == "sparsify":
            out.append(f"stage {s.name!r} re-trains the weights {up.name!r} pruned without its 2:4 masks, so "
                       f"the zeros may not all survive; sparsify's own qat option keeps them")
    return out


def _name(value: Any, where: str) -> str:
    from edgeattn.bundle.manifest import check_model_name

    try:
        return check_model_name(value, where)
    except BundleError as exc:
        raise ConfigError(str(exc)) from None
