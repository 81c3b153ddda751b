"""Swap edgeattn::WindowedAttention into Hugging Face BERT-family and Llama-family models.

transformers 5 looks attention up by name (`AttentionInterface`) and builds masks by the same name
(`AttentionMaskInterface`). We register both under ATTN_IMPLEMENTATION: the mask function hands the
2-D padding mask through unchanged (the op does causal and window masking itself) and the attention
function calls the op. The window comes from the model call's kwargs (`edgeattn_window=...`, default
full); sinks from `model.config.edgeattn_sinks`.
"""

from __future__ import annotations

from edgeattn.attention.torch_module import windowed_attention
from edgeattn.errors import ModelError

ATTN_IMPLEMENTATION = "edgeattn_windowed"
WINDOW_KWARG = "edgeattn_window"


def _padding_mask(*, attention_mask=None, **_):
    """The mask 'function': the [B, S_k] padding mask as bool (None when there is none)."""
    if attention_mask is None or attention_mask.dim() != 2:
        return None
    return attention_mask.bool()


def hf_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout: float = 0.0,
                         **kwargs):
    """transformers attention interface: query [B, H, S, D], key/value [B, H_kv, S, D] -> [B, S, H, D]."""
    window = kwargs.get(WINDOW_KWARG, 0)
    sinks = int(getattr(module.config, "edgeattn_sinks", 0) or 0)
    causal = bool(getattr(module, "is_causal", False))
    mask = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
    if attention_mask is not None and mask is None:
        raise ModelError(f"{ATTN_IMPLEMENTATION}: expected a [B, S] padding mask, found shape "
                         f"{tuple(attention_mask.shape)} (was the model switched with use_windowed_attention?)")
    out = windowed_attention(query, key, value, window, mask, causal=causal, sinks=sinks, scale=scaling or 0.0)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ATTN_IMPLEMENTATION known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, hf_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _padding_mask)


def use_windowed_attention(model, *, sinks: int = 0):
    """Switch a loaded BERT- or Llama-family model to the windowed op, in place; returns the model."""
    register()
    if sinks < 0:
        raise ModelError(f"sinks: expected >= 0, found {sinks}")
    model.config.edgeattn_sinks = int(sinks)
    try:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
    except (ValueError, AttributeError):
        model.config._attn_implementation = ATTN_IMPLEMENTATION
    return model
