"""Plan and run a recipe: each stage runs only when its key (options, inputs, version) or its outputs
changed, writes into a staging folder that is renamed into place on success, and records itself.

A run killed in a stage (Ctrl-C, SIGKILL) leaves that stage's previous folder, or none, as it was; the
next run cleans the dead run's staging folder and runs the stage again.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import importlib.metadata
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from edgeattn import atomic
from edgeattn.bundle.manifest import sha256_file
from edgeattn.errors import ConfigError, InputError
from edgeattn.pipeline.recipe import Recipe, Stage
from edgeattn.pipeline.stages import KINDS, Run
from edgeattn.pipeline.state import (RECORD_NAME, StageRecord, digest, hash_tree, is_stage_folder, read_record,
                                     stage_key, tool_versions, why_stale)

RUN, UP_TO_DATE, SKIP = "run", "up to date", "skip"


@dataclass(frozen=True)
class Step:
    stage: Stage
    action: str  # run | up to date | skip
    reason: str


@dataclass(frozen=True)
class Event:
    stage: str
    what: str  # start | progress | done | up to date | skip
    text: str = ""  # progress: a line, or a StepProgress (edgeattn.quantize.progress) of a long task
    record: StageRecord | None = None


def plan(recipe: Recipe, *, force: bool = False, from_stage: str | None = None) -> list[Step]:
    """What a run would do, stage by stage, and why. Reads records and hashes files; runs nothing."""
    forced = _forced(recipe, force, from_stage)
    steps: list[Step] = []
    records: dict[str, StageRecord | None] = {}
    running: set[str] = set()
    for stage in recipe.stages:
        if stage.skip:
            steps.append(Step(stage, SKIP, stage.skip))
            continue
        if stage.name in forced:
            steps.append(Step(stage, RUN, forced[stage.name]))
            running.add(stage.name)
            continue
        if stage.input in running:
            steps.append(Step(stage, RUN, f"after {stage.input} runs (if its output changes)"))
            running.add(stage.name)
            continue
        inputs = _inputs(recipe, stage, records)
        why = why_stale(_folder(recipe, stage), stage_key(stage.kind, stage.options, inputs),
                        {"options": stage.options, "inputs": inputs})
        if why:
            running.add(stage.name)
        else:
            records[stage.name] = read_record(_folder(recipe, stage))
        steps.append(Step(stage, RUN if why else UP_TO_DATE, why or "key and outputs unchanged"))
    return steps


def run(recipe: Recipe, *, force: bool = False, from_stage: str | None = None,
        on_event: Callable[[Event], None] = lambda e: None) -> dict[str, StageRecord]:
    """Run the stages that are not up to date, in order; returns the record of every stage that has one."""
    forced = _forced(recipe, force, from_stage)
    records: dict[str, StageRecord] = {}
    with _lock(recipe.work_dir):
        for stage in recipe.stages:
            folder = _folder(recipe, stage)
            atomic.clean_stale(folder)
            if stage.skip:
                on_event(Event(stage.name, SKIP, stage.skip))
                continue
            inputs = _inputs(recipe, stage, records)
            key = stage_key(stage.kind, stage.options, inputs)
            why = forced.get(stage.name) or why_stale(folder, key, {"options": stage.options, "inputs": inputs})
            if why is None:
                records[stage.name] = read_record(folder)
                on_event(Event(stage.name, UP_TO_DATE, "key and outputs unchanged", records[stage.name]))
                continue
            on_event(Event(stage.name, "start", why))
            records[stage.name] = _execute(recipe, stage, key, inputs, records, folder, on_event)
            on_event(Event(stage.name, "done", f"{records[stage.name].seconds:.1f} s", records[stage.name]))
    return records


def _execute(recipe: Recipe, stage: Stage, key: str, inputs: dict[str, str], records: dict[str, StageRecord],
             folder: Path, on_event: Callable[[Event], None]) -> StageRecord:
    record = StageRecord(stage.name, stage.kind, key, stage.options, inputs, tools=tool_versions())
    chain = tuple(records[s.name].chain_entry() for s in recipe.ancestors(stage)) + (record.chain_entry(running=True),)
    started = time.perf_counter()
    with atomic.directory(folder, owned=is_stage_folder, what="pipeline stage folder") as staging:
        run_ = Run(_source(recipe, stage), staging, lambda msg: on_event(Event(stage.name, "progress", msg)), chain)
        record.summary = KINDS[stage.kind].run(stage.parsed, run_)
        record.outputs = hash_tree(staging, skip=(RECORD_NAME,))
        record.seconds = round(time.perf_counter() - started, 3)
        record.finished = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        atomic.write_text(staging / RECORD_NAME, record.to_json())
    return record


def _forced(recipe: Recipe, force: bool, from_stage: str | None) -> dict[str, str]:
    """Stage name -> why it runs whatever its record says (--force, --from)."""
    if force:
        return {s.name: "--force" for s in recipe.stages}
    if from_stage is None:
        return {}
    names = [s.name for s in recipe.stages]
    if from_stage not in names:
        raise ConfigError(f"--from {from_stage}: expected a stage of {recipe.path.name} "
                          f"({', '.join(names)})")
    return {n: f"--from {from_stage}" for n in names[names.index(from_stage):]}


def _folder(recipe: Recipe, stage: Stage) -> Path:
    return recipe.work_dir / stage.name


def artifact_path(recipe: Recipe, stage: Stage, artifact: str) -> Path:
    """Where a stage's artifact (onnx, hf, bundle, repo) lies once the stage has run."""
    return _folder(recipe, stage) / dict(stage.parsed.writes)[artifact]


def _source(recipe: Recipe, stage: Stage) -> str | Path:
    if stage.input is None:
        return stage.parsed.model
    return artifact_path(recipe, recipe.stage(stage.input), stage.reads)


def _inputs(recipe: Recipe, stage: Stage, records: dict[str, StageRecord]) -> dict[str, str]:
    """Input label -> sha256 of everything the stage reads."""
    out = {f"option {key}": sha256_file(path) for key, path in stage.parsed.files}
    if stage.input is None:
        out[KINDS[stage.kind].input_option] = _external_digest(stage.parsed.model)
    else:
        up = recipe.stage(stage.input)
        out[f"{up.name}:{stage.reads}"] = records[up.name].artifact_digest(dict(up.parsed.writes)[stage.reads])
    return out


def _external_digest(model: str | Path) -> str:
    if isinstance(model, str):  # a packaged alias: the package's name and version
        from edgeattn.hf_models import PACKAGED

        entry = PACKAGED[model]
        return digest({"alias": model, "package": entry.package,
                       "version": importlib.metadata.version(entry.package)})
    if Path(model).is_file():
        return sha256_file(Path(model))
    return digest(hash_tree(Path(model)))


@contextlib.contextmanager
def _lock(work_dir: Path) -> Iterator[None]:
    """One run per work folder at a time (the lock goes with the process, SIGKILL included)."""
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(work_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise InputError(f"work_dir {work_dir}: expected a folder this user can write, found "
                         f"{exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"{work_dir}: another pipeline run is using this folder; expected it to be free") from None
        yield
    finally:
        os.close(fd)
