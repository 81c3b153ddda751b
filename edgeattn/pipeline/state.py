"""What a pipeline remembers between runs: one `stage.json` per stage folder.

A stage's key is the sha256 of its kind, its options (canonical JSON), the sha256 of everything it
reads (the earlier stage's output, or the model / files the recipe names) and the edgeattn version. A
stage is up to date when its folder holds a record with the same key and every output file still has
the hash the record gives. The record lies inside the folder that is renamed into place when the stage
succeeds, so a record never describes a half-written output.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeattn import __version__
from edgeattn.bundle.manifest import sha256_file

RECORD_NAME = "stage.json"
RECORD_FORMAT = 1
TOOLS = ("torch", "transformers", "onnx", "onnxruntime", "onnxscript", "onnx-ir", "tensorrt_rtx", "tensorrt")


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def digest(obj: Any) -> str:
    return hashlib.sha256(canonical(obj).encode("utf-8")).hexdigest()


def hash_tree(path: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """{relative path: sha256} of a file, or of every file under a folder (sorted, links refused)."""
    path = Path(path)
    if path.is_file():
        return {path.name: sha256_file(path)}
    out = {}
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).as_posix()
        if p.is_symlink():
            out[rel] = "link:" + str(p.readlink())
        elif p.is_file() and rel not in skip:
            out[rel] = sha256_file(p)
    return out


def tool_versions() -> dict[str, str]:
    versions = {"edgeattn": __version__, "python": platform.python_version()}
    for name in TOOLS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def stage_key(kind: str, options: dict, inputs: dict[str, str]) -> str:
    return digest({"kind": kind, "options": options, "inputs": inputs, "edgeattn": __version__})


@dataclass
class StageRecord:
    """One stage's run: what it was asked, what it read and wrote (sha256), how long, with which tools."""

    name: str
    kind: str
    key: str
    options: dict[str, Any]
    inputs: dict[str, str]  # input label (stage:artifact, model, option) -> sha256
    outputs: dict[str, str] = field(default_factory=dict)  # relative path -> sha256
    seconds: float = 0.0
    finished: str = ""
    tools: dict[str, str] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    format: int = RECORD_FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=str) + "\n"

    def chain_entry(self, *, running: bool = False) -> dict[str, Any]:
        """The record as the bundle manifest's `pipeline` section lists it. `running`: the stage writing
        the bundle, whose outputs are the bundle's own files (the manifest hashes them)."""
        entry = asdict(self)
        if running:
            for name in ("outputs", "seconds", "finished", "summary"):
                entry.pop(name)
            entry["outputs"] = "this bundle: see the manifest's files"
        return entry

    def artifact_digest(self, relpath: str) -> str:
        """sha256 over the output files of one artifact (a file, or a folder's files)."""
        prefix = relpath.rstrip("/") + "/"
        files = {k: v for k, v in self.outputs.items() if k == relpath or k.startswith(prefix)}
        return digest(files)


def read_record(folder: Path) -> StageRecord | None:
    path = Path(folder) / RECORD_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != RECORD_FORMAT:
            return None
        return StageRecord(**data)
    except (OSError, ValueError, TypeError):
        return None


def is_stage_folder(folder: Path) -> bool:
    """An earlier run of a pipeline stage wrote this folder (so a new run may replace it)."""
    return Path(folder).is_dir() and not Path(folder).is_symlink() and read_record(folder) is not None


def why_stale(folder: Path, key: str, parts: dict[str, Any]) -> str | None:
    """None when the stage folder is up to date for `key`; otherwise the reason it must run."""
    record = read_record(folder)
    if record is None:
        return "no earlier run" if not Path(folder).exists() else "no complete earlier run"
    if record.key != key:
        return _changed(record, parts)
    found = hash_tree(folder, skip=(RECORD_NAME,))
    for rel, sha in record.outputs.items():
        if rel not in found:
            return f"output {rel} is missing"
        if found[rel] != sha:
            return f"output {rel} changed since it was written"
    extra = sorted(set(found) - set(record.outputs))
    if extra:
        return f"the folder holds a file the stage did not write: {extra[0]}"
    return None


def _changed(record: StageRecord, parts: dict[str, Any]) -> str:
    if record.tools.get("edgeattn") != __version__:
        return f"edgeattn changed ({record.tools.get('edgeattn')} -> {__version__})"
    if record.options != parts["options"]:
        keys = sorted(k for k in set(record.options) | set(parts["options"])
                      if record.options.get(k) != parts["options"].get(k))
        return f"options changed: {', '.join(keys)}"
    changed = sorted(k for k in set(record.inputs) | set(parts["inputs"])
                     if record.inputs.get(k) != parts["inputs"].get(k))
    if changed:
        return f"input changed: {', '.join(changed)}"
    return "its key changed"
