"""Atomic writes: whole or nothing, and the permissions an ordinary write would give."""

import os
import stat

import pytest

from edgeattn import atomic


@pytest.fixture(params=[0o022, 0o077])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_files_and_folders_get_the_umask_permissions(tmp_path, umask):
    atomic.write_text(tmp_path / "a.json", "{}")
    assert mode(tmp_path / "a.json") == 0o666 & ~umask
    with atomic.directory(tmp_path / "bundle") as staging:
        (staging / "x").write_text("1")
    assert mode(tmp_path / "bundle") == 0o777 & ~umask
    assert (tmp_path / "bundle" / "x").read_text() == "1"


def test_a_failed_write_keeps_the_old_artifact(tmp_path):
    atomic.write_text(tmp_path / "m.onnx", "old")
    with pytest.raises(RuntimeError):
        with atomic.directory(tmp_path / "b") as staging:
            (staging / "y").write_text("partial")
            raise RuntimeError("interrupted")
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".b.*"))
    with pytest.raises(TypeError):
        atomic.write_bytes(tmp_path / "m.onnx", "not bytes")  # fails inside the write
    assert (tmp_path / "m.onnx").read_text() == "old" and not list(tmp_path.glob(".m.onnx.*"))
