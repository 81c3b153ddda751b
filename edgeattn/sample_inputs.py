"""Plausible inputs for a model, from its input specs: token ids in range, masks of ones, and so on."""

from __future__ import annotations

import numpy as np

from edgeattn.errors import ConfigError
from edgeattn.onnx_model import TensorSpec

TOKEN_ID_HIGH = 1000  # below every vocabulary we ship (MiniLM 30522, SmolLM2 49152)


def concrete_shape(spec: TensorSpec, sizes: dict[str, int]) -> tuple[int, ...]:
    shape = []
    for d in spec.dims:
        if isinstance(d, int):
            shape.append(d)
        elif d in sizes:
            shape.append(sizes[d])
        else:
            raise ConfigError(f"input {spec.name!r}: no size for dynamic dimension {d!r}")
    return tuple(shape)


def make_inputs(specs: list[TensorSpec] | tuple[TensorSpec, ...], sizes: dict[str, int], *,
                seed: int = 0, window: int = 0) -> dict[str, np.ndarray]:
    """One array per input. `window` feeds inputs whose role is 'window' (0 means full attention)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        shape = concrete_shape(spec, sizes)
        dtype = np.dtype(spec.dtype) if spec.dtype != "bfloat16" else np.dtype("float32")
        if spec.role == "window":
            feeds[spec.name] = np.full(shape, window, dtype=dtype)
        elif spec.role == "logits_to_keep":  # 0: every position, as the model was exported
            feeds[spec.name] = np.zeros(shape, dtype=dtype)
        elif spec.role == "mask":
            feeds[spec.name] = np.ones(shape, dtype=dtype)
        elif spec.role == "token_type":
            feeds[spec.name] = np.zeros(shape, dtype=dtype)
        elif spec.role == "positions":
            feeds[spec.name] = np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
        elif np.issubdtype(dtype, np.integer):
            feeds[spec.name] = rng.integers(0, TOKEN_ID_HIGH, size=shape, dtype=dtype)
        elif dtype == np.bool_:
            feeds[spec.name] = np.ones(shape, dtype=dtype)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
    return feeds
