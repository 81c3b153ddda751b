"""The quick start's commands print edgeattn's lines only; other libraries' warnings appear with -v."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from onnx_fixtures import requires_minilm, requires_torch

EDGEATTN = [sys.executable, "-m", "edgeattn.cli.main"]
THIRD_PARTY = re.compile(r"Warning:|^W\d{4} |torchvision is not installed|it/s\]", re.M)


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("TORCH_LOGS", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "PYTHONWARNINGS")}
    result = subprocess.run([*EDGEATTN, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
@requires_torch
@requires_minilm
def test_quick_start_prints_no_third_party_warning(tmp_path):
    out = [_run("export", "minilm", "--out", "m.onnx", cwd=tmp_path),
           _run("build", "m.onnx", "--target", "cpu", "--out", "m.edgeattn", cwd=tmp_path),
           _run("bench", "m.edgeattn", "--warmup", "1", "--iterations", "3", cwd=tmp_path)]
    for result in out:
        assert not THIRD_PARTY.search(result.stdout + result.stderr), result.stderr[-3000:]
    assert "wrote m.onnx" in out[0].stdout and "parity: pass" in out[1].stderr
    verbose = _run("-v", "export", "minilm", "--out", "v.onnx", cwd=tmp_path)
    assert THIRD_PARTY.search(verbose.stderr), "with -v the exporter's warnings are shown"
