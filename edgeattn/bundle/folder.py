"""A bundle: a folder holding the processed model, the engine or optimized model, a manifest and a report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgeattn.errors import BundleError
from edgeattn.bundle.manifest import MANIFEST_NAME, REPORT_NAME, Manifest, inside


@dataclass(frozen=True)
class Bundle:
    """An opened bundle. Every file is reached through `file`, which hands out only the hashed files."""

    path: Path
    manifest: Manifest

    @property
    def artifact(self) -> Path:
        return self.file(self.manifest.artifact)

    @property
    def report(self) -> Path:
        return self.file(REPORT_NAME)

    def file(self, name: str) -> Path:
        """The path of one of the bundle's files: a name the manifest hashes, inside the bundle; anything else
        is a BundleError (a manifest that points outside, or a file added or edited after the build)."""
        if not isinstance(name, str) or name not in self.manifest.files:
            raise BundleError(f"{self.path}: expected {str(name)[:80]!r} to be one of the bundle's hashed files "
                              f"({', '.join(sorted(self.manifest.files))}), found it is not listed in the manifest")
        return inside(self.path, name, f"{self.path}: files")


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


def read_manifest_text(path: Path) -> str:
    """A manifest's text; a file that cannot be read, or is not UTF-8 text, is a BundleError."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BundleError(f"{path} is not a manifest: expected UTF-8 JSON text, found binary data") from None
    except OSError as exc:
        raise BundleError(f"{path} cannot be read: {exc.strerror or exc}") from None


def open_bundle(path: str | Path, *, verify: bool = True) -> Bundle:
    """Read a bundle's manifest and, unless told not to, check every file against its hash."""
    path = Path(path)
    if not path.exists():
        raise BundleError(f"bundle not found: {path}")
    manifest_path = path / MANIFEST_NAME
    if not path.is_dir() or not manifest_path.is_file():
        raise BundleError(f"{path} is not a bundle: expected a folder with {MANIFEST_NAME}")
    manifest = Manifest.from_json(read_manifest_text(manifest_path), str(manifest_path))
    if verify:
        manifest.verify_files(path)
    return Bundle(path, manifest)
