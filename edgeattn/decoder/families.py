"""The causal LM families the decoder export takes, and why it refuses the others.

Light on purpose (no torch, no transformers import): the CLI and the quantize pipeline read it from a model's
config before anything heavy loads. What each family needs in the exported graph is handled
by `cached_llama.CachedDecoder`; this module says *whether* a config can go through it, and with which
per-layer windows.

| family (model_type)        | differences the export handles                                                   |
|----------------------------|----------------------------------------------------------------------------------|
| llama, smollm3             | the reference layout                                                             |
| mistral                    | `sliding_window` on every layer                                                   |
| qwen2                      | q/k/v biases; sliding layers from `layer_types` when `use_sliding_window`         |
| qwen3                      | per-head q/k RMSNorm before RoPE                                                  |
| gemma                      | scaled embedding, (1 + w) RMSNorm, GELU MLP                                       |
| gemma2                     | + norms after attention and around the MLP, query_pre_attn_scalar, attention and |
|                            | final logit soft-capping, alternating sliding / full layers                      |
| gemma3_text (gemma3)       | + q/k norms, per-layer sliding windows, a local RoPE base for sliding layers      |
| phi3                       | fused qkv and gate_up projections, partial rotary, `sliding_window`               |
"""

from __future__ import annotations

from edgeattn.hf_models import kind_of

FAMILIES: dict[str, str] = {
    "llama": "Llama", "smollm3": "SmolLM3", "mistral": "Mistral", "qwen2": "Qwen 2", "qwen3": "Qwen 3",
    "gemma": "Gemma", "gemma2": "Gemma 2", "gemma3_text": "Gemma 3", "phi3": "Phi-3",
}
LAYER_TYPES = ("full_attention", "sliding_attention")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # frequencies fixed at load time; others follow the length


def text_config(config):
    """The language model's config: the config itself, or a multimodal model's text config (Gemma 3 4B+)."""
    sub = getattr(config, "text_config", None)
    return sub if sub is not None and getattr(sub, "model_type", None) else config


def _rope_types(config) -> set[str]:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    nested = [p for p in params.values() if isinstance(p, dict)] if isinstance(params, dict) else []
    found = {str((p or {}).get("rope_type") or (p or {}).get("type") or "default") for p in nested or [params]}
    return found or {"default"}


def _has_rope(config) -> bool:
    return any(getattr(config, name, None) is not None for name in ("rope_parameters", "rope_theta", "rotary_dim",
                                                                    "rope_scaling", "partial_rotary_factor"))


def why_not(config) -> str | None:
    """Why `edgeattn export --decoder` cannot take a model with this config, or None when it can."""
    text = text_config(config)
    kind = text.model_type
    if getattr(config, "is_encoder_decoder", False):
        return f"expected a causal LM, found an encoder-decoder model ({config.model_type})"
    if kind not in FAMILIES:
        archs = ", ".join(getattr(config, "architectures", None) or []) or kind
        if kind_of(config) != "decoder":
            return f"expected a causal LM, found an encoder ({archs})"
        if not _has_rope(text):
            return (f"{kind}: no rotary attention (the cached op keeps keys rotated at their positions; this model "
                    f"adds position embeddings or biases instead)")
        return f"{kind}: no decoder export for this family yet (supported: {', '.join(FAMILIES)})"
    if getattr(text, "use_bidirectional_attention", False):
        return f"{kind}: bidirectional attention (use_bidirectional_attention): not a causal LM"
    other = sorted(set(getattr(text, "layer_types", None) or ()) - set(LAYER_TYPES))
    if other:
        return f"{kind}: unsupported attention type {other[0]!r} (the export handles {', '.join(LAYER_TYPES)})"
    dynamic = sorted(_rope_types(text) - set(STATIC_ROPE))
    if dynamic:
        return (f"{kind}: rope_type {dynamic[0]!r} changes its frequencies with the sequence length; the exported "
                f"graph fixes them (supported: {', '.join(STATIC_ROPE)})")
    if text.num_attention_heads % text.num_key_value_heads:
        return f"{kind}: {text.num_attention_heads} heads is not a multiple of {text.num_key_value_heads} KV heads"
    return None


def layer_windows(config) -> tuple[int | None, ...]:
    """Each layer's trained sliding window (None: full attention), as Hugging Face masks it: a query at t reads
    the keys at t - window < p <= t, which is the cached op's window (t - p < W)."""
    text = text_config(config)
    window = getattr(text, "sliding_window", None)
    types = getattr(text, "layer_types", None)
    if types:
        return tuple(int(window) if t == "sliding_attention" and window else None for t in types)
    return (int(window) if window else None,) * int(text.num_hidden_layers)
