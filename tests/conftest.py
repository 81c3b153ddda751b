"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from onnx_fixtures import tiny_model


@pytest.fixture
def tiny_onnx(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), str(path))
    return path


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()
