"""What the tests of foreign exports share: the windowed torch reference a fused export is checked against."""

from __future__ import annotations

import copy

import numpy as np

from edgeattn.bundle.build import BuildConfig, build


def window_reference(path, model, kind: str, out):
    """Builds `path` for cpu (no parity) into `out` and runs the model with the swapped-in windowed torch op at
    window 3 on a padded batch of 2 x 21. Returns the bundle, the ONNX feeds (window 3), the reference output and
    the mask of real (unpadded) positions."""
    import torch

    from edgeattn.attention.hf_attention import WINDOW_KWARG, use_windowed_attention

    bundle = build(path, BuildConfig(target="cpu", out=out, seq=(1, 24, 64), parity=False))
    ids = torch.randint(0, 1000, (2, 21), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0
    swapped = use_windowed_attention(copy.deepcopy(model))
    with torch.no_grad():
        result = swapped(input_ids=ids, attention_mask=mask, **{WINDOW_KWARG: torch.tensor(3)})
    want = (result.logits if kind == "decoder" else result.last_hidden_state).numpy()
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "attention_window": np.array(3)}
    return bundle, feeds, want, mask.numpy().astype(bool)
