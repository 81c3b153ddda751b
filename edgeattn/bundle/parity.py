"""Parity: the built artifact must compute what the source model computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgeattn.onnx_model import TensorSpec
from edgeattn.runtime.backends.onnxruntime import OnnxRuntimeBackend
from edgeattn.sample_inputs import make_inputs


def compare(reference: Path, candidate: OnnxRuntimeBackend, inputs: tuple[TensorSpec, ...], sizes: dict[str, int],
            *, seed: int = 0, window: int = 0) -> dict:
    """Run the reference model file and the candidate (an active backend) on the same inputs: max abs diff per
    output, the largest reference output and, for a model with `logits`, how often their argmax agree.

    The reference runs with graph optimizations off, so it is the graph exactly as written.
    """
    feeds = make_inputs(inputs, sizes, seed=seed, window=window)
    with OnnxRuntimeBackend(reference, optimize=False) as ref:
        want = ref.infer({k: v for k, v in feeds.items() if k in ref.input_names})
    got = candidate.infer({k: v for k, v in feeds.items()
                           if k in candidate.input_names or k in candidate.optional_input_names})
    diffs = {}
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape:
            diffs[name] = float("inf")
        else:
            diffs[name] = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))) if w.size else 0.0
    reference_max_abs = max((float(np.max(np.abs(w))) for w in want.values() if w.size), default=0.0)
    result = {"max_abs_diff": max(diffs.values(), default=0.0), "per_output": diffs, "sizes": sizes,
              "reference_max_abs": reference_max_abs}
    logits = want.get("logits")
    if logits is not None and got.get("logits") is not None and got["logits"].shape == logits.shape and logits.size:
        result["greedy_agreement"] = float(np.mean(np.argmax(got["logits"], -1) == np.argmax(logits, -1)))
    return result
