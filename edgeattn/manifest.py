"""The bundle manifest: what was built, from what, for which target, and the hash of every file."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeattn.errors import BundleError
from edgeattn.onnx_model import TensorSpec

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
REPORT_NAME = "report.md"


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
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise BundleError(f"{where}: expected format_version {FORMAT_VERSION}, found {version!r}")
        try:
            d["inputs"] = [TensorSpec.from_dict(s) for s in d["inputs"]]
            d["outputs"] = [TensorSpec.from_dict(s) for s in d["outputs"]]
            return cls(**d)
        except (KeyError, TypeError) as exc:
            raise BundleError(f"{where} is missing or has unexpected fields: {exc}") from None

    def input(self, role: str) -> TensorSpec | None:
        return next((s for s in self.inputs if s.role == role), None)

    def hash_files(self, root: Path, names: list[str]) -> None:
        self.files = {n: sha256_file(root / n) for n in sorted(names)}

    def verify_files(self, root: Path) -> None:
        """Raise BundleError naming the first file that is missing or whose hash differs."""
        if not self.files:
            raise BundleError(f"{root}: the manifest lists no files")
        for name, digest in self.files.items():
            path = root / name
            if not path.is_file():
                raise BundleError(f"{root}: file {name} listed in the manifest is missing")
            found = sha256_file(path)
            if found != digest:
                raise BundleError(f"{root}: {name} does not match the manifest: expected sha256 "
                                  f"{digest[:12]}..., found {found[:12]}... (modified after the build)")
