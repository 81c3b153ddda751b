"""Each bad input: one clear line on stderr, a non-zero exit code, no traceback, no partial output."""

from pathlib import Path

import onnx
import pytest

from edgeattn.cli.main import cli
from onnx_fixtures import tiny_model


def _fails_cleanly(result, code: int, *phrases: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("Error: ")
    for phrase in phrases:
        assert phrase in lines[0]
    assert "Traceback" not in result.output


def _no_bundle(folder: Path) -> None:
    assert not [p for p in folder.iterdir() if "edgeattn" in p.name]


def test_missing_file(tmp_path, runner):
    result = runner.invoke(cli, ["build", str(tmp_path / "nope.onnx")])
    _fails_cleanly(result, 2, "model file not found", "nope.onnx")
    _no_bundle(tmp_path)


def test_not_onnx(tmp_path, runner):
    path = tmp_path / "notes.onnx"
    path.write_text("this is not a model\n" * 10)
    _fails_cleanly(runner.invoke(cli, ["build", str(path)]), 2, "notes.onnx")
    _no_bundle(tmp_path)


def test_truncated_onnx(tmp_path, runner):
    path = tmp_path / "cut.onnx"
    data = tiny_model().SerializeToString()
    path.write_bytes(data[: len(data) // 2])
    _fails_cleanly(runner.invoke(cli, ["build", str(path)]), 2, "cut.onnx", "truncated or not ONNX")
    _no_bundle(tmp_path)


def test_unsupported_opset(tmp_path, runner):
    model = tiny_model()
    model.opset_import[0].version = 9
    path = tmp_path / "old.onnx"
    onnx.save(model, str(path))
    _fails_cleanly(runner.invoke(cli, ["build", str(path)]), 2, "unsupported opset 9", "13 to 23")
    _no_bundle(tmp_path)


def test_unknown_target(tiny_onnx, runner):
    _fails_cleanly(runner.invoke(cli, ["build", str(tiny_onnx), "--target", "xavier"]), 2,
                   "unknown target 'xavier'", "orin-agx")
    _no_bundle(tiny_onnx.parent)


@pytest.mark.parametrize("command", ["bench", "inspect-json"])
def test_tampered_bundle(tiny_onnx, runner, command):
    assert runner.invoke(cli, ["build", str(tiny_onnx), "--target", "cpu"]).exit_code == 0
    bundle = tiny_onnx.with_name("tiny.edgeattn")
    report = bundle / "report.md"
    report.write_text(report.read_text() + "\nedited\n")
    if command == "bench":
        _fails_cleanly(runner.invoke(cli, ["bench", str(bundle), "--iterations", "1"]), 3,
                       "report.md does not match the manifest")
    else:
        result = runner.invoke(cli, ["inspect", str(bundle)])
        assert result.exit_code == 3 and "INTEGRITY FAILURE" in result.stdout


def test_not_a_bundle(tmp_path, runner):
    _fails_cleanly(runner.invoke(cli, ["bench", str(tmp_path)]), 3, "is not a bundle")


def test_bad_range_option(tiny_onnx, runner):
    result = runner.invoke(cli, ["build", str(tiny_onnx), "--seq", "8:4:2"])
    assert result.exit_code == 2 and "min <= opt <= max" in result.stderr
    _no_bundle(tiny_onnx.parent)
