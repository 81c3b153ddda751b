"""The bundle manifest: what was built, from what, for which target, and the hash of every file."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeattn.decoder.metadata import GENERATION_FILE, TOKENIZER_FILE
from edgeattn.errors import BundleError
from edgeattn.onnx_model import TensorSpec

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
REPORT_NAME = "report.md"


_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}$")


def check_model_name(name: object, where: str = "model name") -> str:
    """A model name becomes a folder name (Triton repositories) and a URL part: one plain path component."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise BundleError(f"{where}: expected letters, digits, '_', '.', '+' or '-' (not starting with '.' "
                          f"or '-', at most 200), found {str(name)[:80]!r}")
    return name


def inside(root: Path, name: object, where: str = "manifest") -> Path:
    """The path of a file a manifest names, which must be a relative path that resolves inside `root`."""
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        raise BundleError(f"{where}: expected a relative file name inside the bundle, found {str(name)[:80]!r}")
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise BundleError(f"{where}: expected a relative file name inside the bundle, found {name[:80]!r}")
    root_abs = Path(root).resolve()
    path = (root_abs / rel).resolve()
    if root_abs not in path.parents:
        raise BundleError(f"{where}: {name[:80]!r} resolves outside the bundle (a link?)")
    return path


def check_shape_ranges(ranges: object, where: str = "manifest") -> None:
    """shape_ranges: dimension name -> [min, opt, max], integers with 1 <= min <= opt <= max."""
    if not isinstance(ranges, dict):
        raise BundleError(f"{where}: expected shape_ranges to map dimension names to [min, opt, max], "
                          f"found {str(ranges)[:80]!r}")
    for dim, r in ranges.items():
        ok = isinstance(r, list) and len(r) == 3 and all(type(v) is int for v in r) and 1 <= r[0] <= r[1] <= r[2]
        if not ok:
            raise BundleError(f"{where}: shape_ranges[{dim!r}]: expected 3 integers min <= opt <= max, all >= 1, "
                              f"found {str(r)[:80] if isinstance(r, list) else repr(r)[:80]}")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Manifest:
    """Everything a runtime needs to load a bundle, and everything a reader needs to trust it.

    `sections` holds what each stage recorded (passes, attention fusion, sparsity, quantization,
    parity), keyed by stage name.
    """

    name: str
    target: dict[str, Any]
    backend: str
    artifact: str  # file the runtime loads: an ONNX model or an engine
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    shape_ranges: dict[str, list[int]]
    precision: dict[str, Any]
    build_config: dict[str, Any]
    toolchain: dict[str, str]
    source: dict[str, Any]
    sections: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # relative path -> sha256
    format_version: int = FORMAT_VERSION
    created: str = ""

    def to_json(self) -> str:
        d = asdict(self)
        d["inputs"] = [s.as_dict() for s in self.inputs]
        d["outputs"] = [s.as_dict() for s in self.outputs]
        return json.dumps(d, indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "manifest") -> "Manifest":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BundleError(f"{where} is not valid JSON: {exc}") from None
        if not isinstance(d, dict):
            raise BundleError(f"{where}: expected a JSON object, found {type(d).__name__}")
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise BundleError(f"{where}: expected format_version {FORMAT_VERSION}, found {version!r}")
        try:
            d["inputs"] = [TensorSpec.from_dict(s) for s in d["inputs"]]
            d["outputs"] = [TensorSpec.from_dict(s) for s in d["outputs"]]
            manifest = cls(**d)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise BundleError(f"{where} is missing or has unexpected fields: {exc}") from None
        check_model_name(manifest.name, f"{where}: name")
        if not isinstance(manifest.files, dict) or not isinstance(manifest.artifact, str) or \
                not all(isinstance(v, str) for v in manifest.files.values()):
            raise BundleError(f"{where}: expected 'files' to map names to sha256 and 'artifact' to be a name")
        if not isinstance(manifest.sections, dict):
            raise BundleError(f"{where}: expected 'sections' to be an object, found {type(manifest.sections).__name__}")
        check_shape_ranges(manifest.shape_ranges, where)
        return manifest

    def input(self, role: str) -> TensorSpec | None:
        return next((s for s in self.inputs if s.role == role), None)

    def loaded_files(self) -> list[object]:
        """The files a runtime opens: the artifact and the files it reads, and, for a decoder, its generation
        settings, its tokenizer and its fast path. Each must be among the hashed files."""
        names: list[object] = [self.artifact]
        engine = self.sections.get("engine")
        if isinstance(engine, dict) and isinstance(engine.get("extra_files"), list):
            names += engine["extra_files"]  # read with the artifact (its external weights)
        decoder = self.sections.get("decoder")
        if isinstance(decoder, dict):
            names += [GENERATION_FILE, TOKENIZER_FILE]
            if "fast_path_model" in decoder:
                names.append(decoder["fast_path_model"])
        return names

    def hash_files(self, root: Path, names: list[str]) -> None:
        self.files = {n: sha256_file(root / n) for n in sorted(names)}

    def verify_files(self, root: Path) -> None:
        """Raise BundleError naming the first file that is missing, outside the bundle or whose hash differs.

        Every path is checked to lie inside the bundle before anything is read, and every file the runtime
        loads (the artifact, a decoder's tokenizer, settings and fast path) must be among the hashed files."""
        if not self.files:
            raise BundleError(f"{root}: the manifest lists no files")
        paths = {name: inside(root, name, f"{root}: files") for name in self.files}
        for name in self.loaded_files():
            inside(root, name, f"{root}: a file the runtime loads")
            if name not in self.files:
                raise BundleError(f"{root}: {name} is loaded by the runtime but is not among the hashed files; "
                                  f"expected every file the runtime loads to be listed")
        for name, digest in self.files.items():
            path = paths[name]
            if not path.is_file():
                raise BundleError(f"{root}: file {name} listed in the manifest is missing")
            found = sha256_file(path)
            if found != digest:
                raise BundleError(f"{root}: {name} does not match the manifest: expected sha256 "
                                  f"{digest[:12]}..., found {found[:12]}... (modified after the build)")
