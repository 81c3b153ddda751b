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


def test_a_published_temporary_file_gets_the_umask_mode_not_0600(tmp_path, umask):
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=tmp_path)
    os.close(fd)
    atomic.publish(tmp, tmp_path / "model.onnx")
    assert mode(tmp_path / "model.onnx") == 0o666 & ~umask and not os.path.exists(tmp)


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_an_exported_model_gets_the_umask_mode(tmp_path, mask):
    """`edgeattn export` writes through a temporary file: the result is readable as any new file is."""
    pytest.importorskip("transformers")
    from edgeattn.export import ExportConfig, export_module
    from test_fusion_models import _tiny

    model, kind = _tiny("bert", "eager")
    old = os.umask(mask)
    try:
        path = export_module(model, kind, tmp_path / "m.onnx", ExportConfig(exporter="torchscript"))
    finally:
        os.umask(old)
    assert mode(path) == 0o666 & ~mask
