"""Shared fixtures.

Session fixtures from the helper modules are imported here, not in the test modules: a fixture imported into a test
module is that module's own fixture, so a session fixture would be built again for every module that imports it.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

import interpreter_runs
from decoder_fixtures import tiny_decoder, tiny_paged_decoder  # noqa: F401 - session fixtures, built once a run
from onnx_fixtures import tiny_model


@pytest.fixture
def tiny_onnx(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), str(path))
    return path


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def pytest_collection_finish(session):
    """Start the kernels' interpreter cases the selected tests need, in the background (tests/interpreter_runs.py)."""
    if not session.config.option.collectonly:
        interpreter_runs.start(session.items)


def pytest_sessionfinish(session, exitstatus):
    interpreter_runs.stop()
