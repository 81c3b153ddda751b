"""A rotary causal LM that reads and returns its KV cache through edgeattn::CachedWindowedAttention.

The Hugging Face model's own modules (embeddings, norms, projections, MLPs, rotary embedding, LM head) do
the work; only attention and the cache are ours. One call runs a chunk of S new tokens per stream:

    logits, presents = model(input_ids [B, S], cache_position [B], window [], past [2L x [B, H_kv, C, D]])

With a page size (the attention budget, docs/windowed-attention.md) the model also reads the retrieval pages k
(an int64 scalar, after the window) and per layer the key bounds [B, H_kv, P, 2, D] (after the cache):

    logits, presents = model(input_ids, cache_position, window, pages, *past, *key_bounds)

With `dense_layers` N (Quest's rule: its first two layers are dense, their attention is the least sparse) the first
N layers read the whole ring whenever k > 0; a window alone (k = 0) reads the same rows in every layer.

`presents` are the chunk's keys (rotated at their true positions) and values, [B, H_kv, S, D] per layer:
the caller writes them into its ring (`cached_torch.write_ring_`, or the runtime's numpy writer). Queries are
rotated twice: at t for the window rows and at min(t, sinks + W) for the sink rows (edgeattn.attention.ring);
with k > 0 at min(t, sinks + W_max), the span the pages reach.

Family differences (edgeattn.decoder.families) are read off the modules: a fused `qkv_proj` (Phi-3), q/k
norms (Qwen 3, Gemma 3), norms after attention and around the MLP (Gemma 2 / 3), partial rotary (the
rotary tables narrower than a head), a rotary embedding per layer type (Gemma 3's local base), soft-capped
attention and final logits (Gemma 2). A layer with a trained sliding window T reads min(W, T) keys.
"""

from __future__ import annotations

import inspect

import torch

from edgeattn.attention.cached_torch import cached_windowed_attention
from edgeattn.decoder import families
from edgeattn.errors import ModelError


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    """x: [B, H, S, D]; cos, sin: [B, S, R], R <= D: the first R features rotate (partial rotary), the rest pass."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos[:, None] + _rotate_half(x) * sin[:, None]
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat((x_rot * cos[:, None] + _rotate_half(x_rot) * sin[:, None], x_pass), dim=-1)


def _parts(hf_model):
    """(the text backbone with .layers / .embed_tokens / .norm / .rotary_emb, the LM head)."""
    backbone = hf_model.model
    backbone = getattr(backbone, "language_model", None) or backbone  # multimodal Gemma 3: its text model
    head = getattr(hf_model, "lm_head", None) or hf_model.get_output_embeddings()
    return backbone, head


class CachedDecoder(torch.nn.Module):
    def __init__(self, hf_model, sinks: int, page: int = 0, dense_layers: int = 0):
        super().__init__()
        reason = families.why_not(hf_model.config)
        if reason:
            raise ModelError(f"decoder export: {reason}")
        config = families.text_config(hf_model.config)
        self.inner = hf_model
        self.backbone, self.head = _parts(hf_model)
        self.sinks, self.page = int(sinks), int(page)
        self.layers = self.backbone.layers
        if dense_layers and (not self.page or not 0 < dense_layers <= len(self.layers)):
            raise ModelError(f"decoder export: dense layers read the whole ring when a budget reads pages: expected "
                             f"a page size and 1 to {len(self.layers)} layers, found page {self.page} and "
                             f"{dense_layers} layers")
        self.dense_layers = int(dense_layers)
        first = self.layers[0].self_attn
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = first.head_dim
        self.scale = float(first.scaling)
        self.windows = families.layer_windows(config)
        if any(self.windows) and self.sinks:
            raise ModelError(f"decoder export: layers with a trained sliding window read exactly their window; sinks "
                             f"would add {self.sinks} keys to it: expected sinks 0, found {self.sinks}")
        if any(self.windows) and self.page:
            raise ModelError(f"decoder export: layers with a trained sliding window read exactly their window; "
                             f"retrieval pages would add keys to it: expected page 0, found {self.page}")
        self.layer_types = getattr(config, "layer_types", None) or [None] * len(self.layers)
        rope = self.backbone.rotary_emb
        self._rope_by_type = "layer_type" in inspect.signature(rope.forward).parameters
        self.attn_softcap = float(getattr(config, "attn_logit_softcapping", None) or 0.0)
        self.final_softcap = float(getattr(config, "final_logit_softcapping", None) or 0.0)

    def _rotary(self, h, positions, layer_type):
        rope = self.backbone.rotary_emb
        return rope(h, positions, layer_type) if self._rope_by_type else rope(h, positions)

    def _qkv(self, attn, x, b, s):
        """q [B, H, S, D], k, v [B, H_kv, S, D] from the layer's projections (separate or one fused qkv_proj)."""
        hd, kvd = self.heads * self.head_dim, self.kv_heads * self.head_dim
        if hasattr(attn, "qkv_proj"):
            q, k, v = attn.qkv_proj(x).split((hd, kvd, kvd), dim=-1)
        else:
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        return q, *(t.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2) for t in (k, v))

    def forward(self, input_ids, cache_position, window, *rest):
        m = self.backbone
        n = 2 * len(self.layers)
        pages, past, bounds = (rest[0], rest[1:1 + n], rest[1 + n:]) if self.page else (None, rest, None)
        b, s = input_ids.shape
        positions = cache_position.reshape(b, 1) + torch.arange(s, device=input_ids.device)  # [B, S]
        wmax = past[0].shape[2] - self.sinks
        w = window.reshape(()).to(torch.int64)
        w = torch.where((w <= 0) | (w > wmax), torch.full_like(w, wmax), w)
        reads = None if pages is None else pages.reshape(()) > 0  # the budget reads pages: the whole ring's span
        sink_w = w if reads is None else torch.where(reads, torch.full_like(w, wmax), w)
        sink_positions = torch.minimum(positions, self.sinks + sink_w)  # min(t, sinks + W), W_max under pages
        h = m.embed_tokens(input_ids)  # Gemma's embedding module applies its sqrt(hidden) scale itself
        tables = {t: (self._rotary(h, positions, t), self._rotary(h, sink_positions, t)) for t in set(self.layer_types)}
        capped = {t: torch.minimum(w, torch.full_like(w, t)) for t in set(self.windows) if t}  # min(W, trained)
        if self.dense_layers:  # with k > 0: window 0 (the whole ring) and no pages; the sinks as under pages
            dense_window = torch.where(reads, torch.zeros_like(w), window.reshape(()).to(torch.int64))
        presents = []
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            (cos, sin), (cos_s, sin_s) = tables[self.layer_types[i]]
            dense = i < self.dense_layers
            q, k, v = self._qkv(attn, layer.input_layernorm(h), b, s)
            if hasattr(attn, "q_norm"):  # Qwen3 / Gemma 3: per-head norms before RoPE
                q, k = attn.q_norm(q), attn.k_norm(k)
            q_t, q_s, k_t = apply_rope(q, cos, sin), apply_rope(q, cos_s, sin_s), apply_rope(k, cos, sin)
            o = cached_windowed_attention(q_t, q_s, k_t, v, past[2 * i], past[2 * i + 1], cache_position,
                                          dense_window if dense else capped.get(self.windows[i], window),
                                          torch.zeros_like(pages) if dense else pages,
                                          None if bounds is None else bounds[i], sinks=self.sinks,
                                          scale=float(attn.scaling), softcap=self.attn_softcap)
            o = attn.o_proj(o.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))
            if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma 2 / 3: sandwich norms
                h = h + layer.post_attention_layernorm(o)
                h = h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))
            else:
                h = h + o
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            presents += [k_t, v]
        logits = self.head(m.norm(h))
        if self.final_softcap:  # Gemma 2: cap * tanh(logits / cap)
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return (logits, *presents)
