"""A command never deletes or overwrites what it did not write (issue: reliability, items 1-3).

Each test runs the real CLI on real files and failed on the code before the fix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest

from edgeattn.bundle.build import BuildConfig, build
from edgeattn.bundle.folder import open_bundle
from edgeattn.cli.main import cli
from edgeattn.errors import BundleError
from edgeattn.bundle.manifest import sha256_file
from onnx_fixtures import tiny_model


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_build_refuses_an_out_folder_that_holds_the_source(tmp_path, runner):
    proj = tmp_path / "proj"
    proj.mkdir()
    onnx.save(tiny_model(), str(proj / "m.onnx"))
    (proj / "notes.txt").write_text("mine")
    result = runner.invoke(cli, ["build", str(proj / "m.onnx"), "--target", "cpu", "--out", str(proj)])
    assert result.exit_code == 2 and "does not contain the model" in result.output
    assert _listing(proj) == ["m.onnx", "notes.txt"] and (proj / "notes.txt").read_text() == "mine"


def test_build_refuses_a_folder_that_is_not_a_bundle(tmp_path, tiny_onnx, runner):
    other = tmp_path / "data"
    other.mkdir()
    (other / "keep.bin").write_bytes(b"\x00" * 10)
    result = runner.invoke(cli, ["build", str(tiny_onnx), "--target", "cpu", "--out", str(other)])
    assert result.exit_code == 2 and "not an edgeattn bundle" in result.output
    assert _listing(other) == ["keep.bin"]


def test_build_refuses_an_existing_file_and_leaves_no_backup(tmp_path, tiny_onnx, runner):
    target = tmp_path / "out.txt"
    target.write_text("user data")
    result = runner.invoke(cli, ["build", str(tiny_onnx), "--target", "cpu", "--out", str(target)])
    assert result.exit_code == 2 and "found a file" in result.output
    assert target.read_text() == "user data"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_build_out_dot_is_a_clear_error(tmp_path, runner, monkeypatch):
    onnx.save(tiny_model(), str(tmp_path / "m.onnx"))
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(cli, ["build", "m.onnx", "--target", "cpu", "--out", "."])
    assert result.exit_code == 2 and result.exception is None or isinstance(result.exception, SystemExit)
    assert "does not contain the model" in result.output
    assert _listing(tmp_path) == ["m.onnx"]


def test_build_replaces_an_earlier_bundle(tiny_onnx, tmp_path):
    out = tmp_path / "b"
    first = build(tiny_onnx, BuildConfig(target="cpu", out=out))
    second = build(tiny_onnx, BuildConfig(target="cpu", out=out, name="renamed"))
    assert first.path == second.path and open_bundle(out).manifest.name == "renamed"
    assert _listing(tmp_path) == ["b", "tiny.onnx"]


def test_a_killed_build_leaves_staging_that_the_next_build_cleans(tmp_path, tiny_onnx):
    """SIGKILL during the engine step leaves a .partial folder; the next build removes it."""
    out = tmp_path / "b"
    script = textwrap.dedent(f"""
        import os, signal
        import edgeattn.engines.onnxruntime as e
        def die(*a, **k):
            os.kill(os.getpid(), signal.SIGKILL)
        e.build_artifact = die
        from edgeattn.bundle.build import BuildConfig, build
        build({str(tiny_onnx)!r}, BuildConfig(target="cpu", out=__import__("pathlib").Path({str(out)!r})))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    stale = [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    assert len(stale) == 1 and (stale[0] / "model.onnx").exists()
    build(tiny_onnx, BuildConfig(target="cpu", out=out))
    assert _listing(tmp_path) == ["b", "tiny.onnx"]


def test_staging_of_a_live_writer_is_left_alone(tmp_path):
    from edgeattn import atomic

    live = tmp_path / f".b.{os.getppid()}.abc.partial"
    live.mkdir()
    atomic.clean_stale(tmp_path / "b")
    assert live.exists()


def _bundle(tiny_onnx, tmp_path) -> Path:
    return build(tiny_onnx, BuildConfig(target="cpu", out=tmp_path / "b")).path


def _edit_manifest(bundle: Path, **changes) -> None:
    path = bundle / "manifest.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_export_triton_refuses_a_manifest_name_with_a_path(tmp_path, tiny_onnx, runner):
    bundle = _bundle(tiny_onnx, tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep")
    _edit_manifest(bundle, name="../victim")
    repo = tmp_path / "repo"
    result = runner.invoke(cli, ["export-triton", str(bundle), "--repo", str(repo)])
    assert result.exit_code == 3 and "name" in result.output
    assert _listing(victim) == ["precious.txt"]
    assert not repo.exists()
    inspect = runner.invoke(cli, ["inspect", str(bundle)])
    assert inspect.exit_code != 0


def test_export_triton_keeps_folders_and_launch_scripts_it_did_not_write(tmp_path, tiny_onnx, runner):
    bundle = _bundle(tiny_onnx, tmp_path)
    repo = tmp_path / "repo"
    (repo / "tiny").mkdir(parents=True)
    (repo / "tiny" / "mine.txt").write_text("keep")
    result = runner.invoke(cli, ["export-triton", str(bundle), "--repo", str(repo)])
    assert result.exit_code == 2 and "did not write" in result.output
    assert _listing(repo / "tiny") == ["mine.txt"]
    (repo / "tiny" / "mine.txt").unlink()
    (repo / "tiny").rmdir()
    (repo / "launch.sh").write_text("#!/bin/sh\necho my own launcher\n")
    result = runner.invoke(cli, ["export-triton", str(bundle), "--repo", str(repo)])
    assert result.exit_code == 2 and "launch.sh" in result.output
    assert "my own launcher" in (repo / "launch.sh").read_text() and not (repo / "tiny").exists()
    (repo / "launch.sh").unlink()
    for _ in range(2):  # an earlier export of ours is replaced
        result = runner.invoke(cli, ["export-triton", str(bundle), "--repo", str(repo)])
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize("entry", ["../outside.bin", "/etc/hostname", "sub/../../outside.bin"])
def test_manifest_paths_must_stay_inside_the_bundle(tmp_path, tiny_onnx, runner, entry):
    bundle = _bundle(tiny_onnx, tmp_path)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret")
    data = json.loads((bundle / "manifest.json").read_text())
    data["files"][entry] = sha256_file(Path(entry) if entry.startswith("/") else outside)
    (bundle / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match="inside the bundle"):
        open_bundle(bundle)
    result = runner.invoke(cli, ["inspect", str(bundle)])
    assert result.exit_code == 3 and "INTEGRITY FAILURE" in result.output
    assert data["files"][entry][:12] not in result.output  # no hash of an outside file is printed


def test_an_artifact_outside_the_bundle_is_refused(tmp_path, tiny_onnx):
    bundle = _bundle(tiny_onnx, tmp_path)
    (tmp_path / "evil.onnx").write_bytes((bundle / "model.ort.onnx").read_bytes())
    _edit_manifest(bundle, artifact="../evil.onnx")
    with pytest.raises(BundleError, match="inside the bundle"):
        open_bundle(bundle)


def test_an_unlisted_artifact_is_refused(tmp_path, tiny_onnx, runner):
    bundle = _bundle(tiny_onnx, tmp_path)
    data = json.loads((bundle / "manifest.json").read_text())
    del data["files"][data["artifact"]]
    (bundle / "manifest.json").write_text(json.dumps(data))
    (bundle / data["artifact"]).write_bytes(b"corrupted")
    with pytest.raises(BundleError, match="not among the hashed files"):
        open_bundle(bundle)
    assert runner.invoke(cli, ["inspect", str(bundle)]).exit_code == 3


def test_a_link_out_of_the_bundle_is_refused(tmp_path, tiny_onnx):
    bundle = _bundle(tiny_onnx, tmp_path)
    (tmp_path / "elsewhere.md").write_text("x")
    (bundle / "report.md").unlink()
    (bundle / "report.md").symlink_to(tmp_path / "elsewhere.md")
    with pytest.raises(BundleError, match="outside the bundle"):
        open_bundle(bundle)


def test_folder_outputs_are_replaced_only_when_an_earlier_run_wrote_them(tmp_path):
    """Every folder an edgeattn command writes carries a marker: a rerun replaces it, a user's folder is kept."""
    from edgeattn import atomic
    from edgeattn.errors import InputError

    out = tmp_path / "sim"
    for run in ("first", "second"):
        with atomic.directory(out, what="thermal simulation") as staging:
            (staging / "summary.json").write_text(run)
    assert (out / "summary.json").read_text() == "second" and atomic.has_marker(out)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text("keep")
    with pytest.raises(InputError, match="did not write"):
        with atomic.directory(mine) as staging:
            (staging / "summary.json").write_text("overwritten")
    assert (mine / "summary.json").read_text() == "keep"
