"""A bundle: a folder holding the processed model, the engine or optimized model, a manifest and a report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgeattn.errors import BundleError
from edgeattn.bundle.manifest import MANIFEST_NAME, REPORT_NAME, Manifest


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: Manifest

    @property
    def artifact(self) -> Path:
        return self.path / self.manifest.artifact

    @property
    def report(self) -> Path:
        return self.path / REPORT_NAME

    def file(self, name: str) -> Path:
        return self.path / name


def is_bundle(path: Path) -> bool:
    """True for a folder holding an edgeattn manifest (an earlier build that may be replaced)."""
    manifest_path = Path(path) / MANIFEST_NAME
    if not Path(path).is_dir() or Path(path).is_symlink() or not manifest_path.is_file():
        return False
    try:
        Manifest.from_json(manifest_path.read_text(encoding="utf-8"), str(manifest_path))
    except (BundleError, OSError, UnicodeDecodeError):
        return False
    return True


def default_bundle_path(model_path: Path) -> Path:
    """MODEL.onnx -> MODEL.edgeattn/ beside it."""
    return model_path.with_name(model_path.stem + ".edgeattn")


def open_bundle(path: str | Path, *, verify: bool = True) -> Bundle:
    """Read a bundle's manifest and, unless told not to, check every file against its hash."""
    path = Path(path)
    if not path.exists():
        raise BundleError(f"bundle not found: {path}")
    manifest_path = path / MANIFEST_NAME
    if not path.is_dir() or not manifest_path.is_file():
        raise BundleError(f"{path} is not a bundle: expected a folder with {MANIFEST_NAME}")
    manifest = Manifest.from_json(manifest_path.read_text(encoding="utf-8"), str(manifest_path))
    if verify:
        manifest.verify_files(path)
    return Bundle(path, manifest)
