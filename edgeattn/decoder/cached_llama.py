"""A Llama-family causal LM that reads and returns its KV cache through edgeattn::CachedWindowedAttention.

The Hugging Face model's own modules (embeddings, norms, projections, MLPs, rotary embedding, LM head) do
the work; only attention and the cache are ours. One call runs a chunk of S new tokens per stream:

    logits, presents = model(input_ids [B, S], cache_position [B], window [], past [2L x [B, H_kv, C, D]])

`presents` are the chunk's keys (rotated at their true positions) and values, [B, H_kv, S, D] per layer:
the caller writes them into its ring (`cached_torch.write_ring_`, or the runtime's numpy writer). Queries are
rotated twice: at t for the window rows and at min(t, sinks + W) for the sink rows (edgeattn.attention.ring).
"""

from __future__ import annotations

import torch

from edgeattn.attention.cached_torch import cached_windowed_attention
from edgeattn.errors import ModelError

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "smollm3")


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    """x: [B, H, S, D]; cos, sin: [B, S, D]."""
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


class CachedDecoder(torch.nn.Module):
    def __init__(self, hf_model, sinks: int):
        super().__init__()
        config = hf_model.config
        if config.model_type not in SUPPORTED:
            raise ModelError(f"decoder export: expected a Llama-family model ({', '.join(SUPPORTED)}), "
                             f"found model_type {config.model_type!r}")
        self.inner = hf_model
        self.sinks = int(sinks)
        self.layers = hf_model.model.layers
        first = self.layers[0].self_attn
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = first.head_dim
        self.scale = float(first.scaling)

    def forward(self, input_ids, cache_position, window, *past):
        m = self.inner.model
        b, s = input_ids.shape
        positions = cache_position.reshape(b, 1) + torch.arange(s, device=input_ids.device)  # [B, S]
        wmax = past[0].shape[2] - self.sinks
        w = window.reshape(()).to(torch.int64)
        w = torch.where((w <= 0) | (w > wmax), torch.full_like(w, wmax), w)
        sink_positions = torch.minimum(positions, self.sinks + w)
        h = m.embed_tokens(input_ids)
        cos, sin = m.rotary_emb(h, positions)
        cos_s, sin_s = m.rotary_emb(h, sink_positions)
        presents = []
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)  # q: [B, H, S, D]
            k = attn.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)  # k: [B, H_kv, S, D]
            v = attn.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
            if hasattr(attn, "q_norm"):  # Qwen3-style per-head norms before RoPE
                q, k = attn.q_norm(q), attn.k_norm(k)
            q_t, q_s, k_t = apply_rope(q, cos, sin), apply_rope(q, cos_s, sin_s), apply_rope(k, cos, sin)
            o = cached_windowed_attention(q_t, q_s, k_t, v, past[2 * i], past[2 * i + 1], cache_position, window,
                                          sinks=self.sinks, scale=self.scale)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            presents += [k_t, v]
        logits = self.inner.lm_head(m.norm(h))
        return (logits, *presents)
