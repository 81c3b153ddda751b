"""Parity: the built artifact must compute what the source model computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgeattn.onnx_model import TensorSpec
from edgeattn.sample_inputs import make_inputs


def compare(reference: Path, candidate: Path, inputs: tuple[TensorSpec, ...], sizes: dict[str, int],
            *, seed: int = 0, window: int = 0) -> dict:
    """Run both models in ONNX Runtime on the same inputs; max abs diff per output.

    The reference runs with graph optimizations off, so it is the graph exactly as written.
    """
    from edgeattn.runtime.backends.onnxruntime import OnnxRuntimeBackend

    feeds = make_inputs(inputs, sizes, seed=seed, window=window)
    with OnnxRuntimeBackend(reference, optimize=False) as ref, OnnxRuntimeBackend(candidate) as cand:
        want = ref.infer({k: v for k, v in feeds.items() if k in ref.input_names})
        got = cand.infer({k: v for k, v in feeds.items() if k in cand.input_names})
    diffs = {}
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape:
            diffs[name] = float("inf")
        else:
            diffs[name] = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))) if w.size else 0.0
    reference_max_abs = max((float(np.max(np.abs(w))) for w in want.values() if w.size), default=0.0)
    return {"max_abs_diff": max(diffs.values(), default=0.0), "per_output": diffs, "sizes": sizes,
            "reference_max_abs": reference_max_abs}
