"""The Triton kernels on CPU (TRITON_INTERPRET=1, its own process) against the float64 NumPy reference."""

from __future__ import annotations

import pytest

import interpreter_runs
from onnx_fixtures import has

pytestmark = [pytest.mark.triton, pytest.mark.skipif(not (has("triton") and has("torch")), reason="needs triton and torch")]


@pytest.fixture(scope="module")
def kernel_errors() -> dict[str, float]:
    return interpreter_runs.result("kernel_errors")


def test_every_path_matches_the_reference(kernel_errors):
    bad = {k: v for k, v in kernel_errors.items() if k != "window-change-moves-output" and not v <= 2e-3}
    assert not bad, f"max abs error above 2e-3 (fp16): {bad}"


def test_all_paths_were_run(kernel_errors):
    kinds = {k.split(":")[0] for k in kernel_errors}
    for path in ("public", "prefill-tma0-one0", "prefill-tma0-one1", "prefill-tma1-one1", "decode-splits1",
                 "decode-splits4", "prefill-kernel"):
        assert path in kinds
    assert sum(k.startswith("public:") for k in kernel_errors) == 10


def test_window_is_read_at_run_time(kernel_errors):
    # the same tensor, changed in place after a launch, changes the result and matches the new window
    assert kernel_errors["window-changed-in-place"] <= 2e-3
    assert kernel_errors["window-change-moves-output"] > 0.05
