"""Atomic writes: a file or a whole directory appears complete or not at all.

Nothing here replaces what it was not told it may replace: `directory(final, owned=...)` refuses an
existing `final` unless `owned(final)` says an earlier run of ours wrote it. Staging folders carry the
writer's PID, so the next write cleans those of writers that died (SIGKILL) and leaves live ones alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from edgeattn.errors import InputError

MARKER = ".edgeattn-output"  # written into every folder `directory` creates: a later run may replace it
_STAGING = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[^.]+\.(?:partial|old)$")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a plain `open(path, "w")` gives a new file: 0666 less the umask."""
    return 0o666 & ~_umask()


def publish(tmp: str | Path, final: str | Path) -> None:
    """Rename a finished temporary file onto `final`, first giving it the mode a plain write would.

    `tempfile.mkstemp` makes files owner-only (0600), which is right while a file is being written and
    wrong for the result: models and bundles are read by services running as other users."""
    os.chmod(tmp, file_mode())
    os.replace(tmp, final)


def write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder, then rename.

    The file gets the permissions a plain `open(path, "w")` would (0666 less the umask), not the
    owner-only 0600 of a temporary file: bundles are read by services running as other users."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def clean_stale(final: Path) -> list[Path]:
    """Remove staging and backup folders beside `final` left by writers that are no longer running."""
    removed = []
    for entry in final.parent.glob(f".{final.name}.*"):
        m = _STAGING.match(entry.name)
        if m and m["name"] == final.name and entry.is_dir() and not _alive(int(m["pid"])):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def has_marker(folder: Path) -> bool:
    """True for a folder an earlier `directory(...)` wrote (it holds the marker file)."""
    return (Path(folder) / MARKER).is_file()


def _check_replaceable(final: Path, owned: Callable[[Path], bool] | None, what: str) -> None:
    if not final.exists() and not final.is_symlink():
        return
    if final.is_symlink() or not final.is_dir():
        raise InputError(f"{final} exists and is not a folder: expected a new path or an earlier {what}; "
                         f"choose another output or remove it yourself")
    if owned is None or not owned(final):
        raise InputError(f"{final} exists and is not an earlier {what}: refusing to replace a folder this "
                         f"command did not write; choose another output or remove it yourself")


@contextlib.contextmanager
def directory(final: Path, *, owned: Callable[[Path], bool] | None = None,
              what: str = "output of this command") -> Iterator[Path]:
    """Yield an empty staging folder beside `final`; on success it replaces `final` in one rename.

    An existing `final` is replaced only when `owned(final)` is true (an earlier artifact of the same
    kind; by default: it holds the marker file this function writes into every folder it makes); anything
    else raises InputError before any work starts. On any exception (Ctrl-C included)
    the staging folder is removed and `final`, if it existed, is left as it was.
    """
    final = Path(os.path.abspath(final))
    owned = has_marker if owned is None else owned
    if final == final.parent:
        raise InputError(f"{final}: expected a folder path to create, found the file-system root")
    _check_replaceable(final, owned, what)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(final)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.{os.getpid()}.", suffix=".partial", dir=final.parent))
    except OSError as exc:
        raise InputError(f"{final}: expected a place this user can write, found that a folder cannot be created "
                         f"in {final.parent} ({exc.strerror or exc})") from None
    try:
        staging.chmod(0o777 & ~_umask())  # as mkdir would, not mkdtemp's owner-only 0700
        (staging / MARKER).write_text(f"{what}\n", encoding="utf-8")
        yield staging
        _check_replaceable(final, owned, what)  # it may have appeared while we worked
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.{os.getpid()}.", suffix=".old", dir=final.parent))
        os.replace(final, old / "previous")
    os.replace(staging, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
