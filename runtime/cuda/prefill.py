"""Prefill chunks of several streams in one pass, with the decode step's packed weights
(decode_step.PackedDecoder).

The chunks are packed one after another ([T] tokens, T the sum of their lengths), so every matrix product of a
layer runs once for all of them. Attention runs per kind of chunk, once a layer for each kind present, over
the chunks padded to the longest of that kind (padding sits after a chunk's last token, where its causal mask
hides it from the chunk's own queries):
- a stream's first chunk inside its window (it starts at 0 and every query sees the whole stream): causal
  scaled-dot-product attention over the chunk alone (flash where it applies);
- a later chunk still inside the window (no ring wrap, t < sinks + W for its last token): its rows are
  written first, then attention reads cache rows [0, start + S) under a causal mask;
- a chunk past that: the op's reference semantics (edgeattn.attention.cached_torch), which gathers the sinks
  and the last W ring rows; its rows are written after.
A stream's rows never meet another's: each reads its own cache row, so a chunk's logits do not depend on what
else is in the pass (beyond the rounding of a larger matrix product).
"""

from __future__ import annotations

import numpy as np

from edgeattn.optional import require
from edgeattn.runtime.cuda import fp8_cache
from edgeattn.runtime.cuda.decode_step import PackedDecoder, _angles, _rms_norm, layer_head, layer_tail


def prefill_logits(w: PackedDecoder, ids, start: int, window: int, keys, values, row: int, *, last_only=True):
    """ids: [S] int64 on the device, the tokens at positions start .. start + S - 1 of cache row `row`.
    Writes their rows and returns logits [1 or S, V]."""
    return prefill_batch(w, ids, [ids.shape[0]], [start], window, keys, values, [row], last_only=last_only)


class _Group:
    """Chunks of one kind, padded to the longest: `take` [n, S] indexes the packed tokens (a padded place
    repeats its chunk's last token), `real` [n * S] says which places hold a chunk's own token, `tokens` the
    packed index of each real place in order."""

    def __init__(self, torch, members: list[int], offsets, lengths, device) -> None:
        self.members = members
        self.longest = max(int(lengths[i]) for i in members)
        j = np.arange(self.longest)
        take = np.stack([offsets[i] + np.minimum(j, lengths[i] - 1) for i in members])  # [n, S]
        real = np.concatenate([j < lengths[i] for i in members])
        self.take = torch.as_tensor(take, device=device)
        self.real = torch.as_tensor(np.flatnonzero(real), device=device)
        self.tokens = torch.as_tensor(np.concatenate([offsets[i] + np.arange(lengths[i]) for i in members]),
                                      device=device)
        self.whole = len(members) == len(lengths) and len(set(int(n) for n in lengths)) == 1  # all, in order

    def pad(self, x):
        """x: [T, heads, D] -> [n, heads, S, D]."""
        n = len(self.members)
        x = x.view(n, self.longest, *x.shape[1:]) if self.whole else x[self.take]
        return x.transpose(1, 2)

    def unpad_into(self, out, o) -> None:
        """o: [n, H, S, D] -> the real places of out [T, H, D]."""
        o = o.transpose(1, 2)
        if self.whole:
            out.copy_(o.reshape(out.shape))
        else:
            out[self.tokens] = o.reshape(-1, *o.shape[2:])[self.real]


def prefill_batch(w: PackedDecoder, ids, lengths, starts, window: int, keys, values, rows, *, last_only=True):
    """ids: [T] int64 on the device, the chunks of len(rows) streams packed in order: lengths[i] tokens of cache
    row rows[i] (distinct rows) at positions starts[i] .. starts[i] + lengths[i] - 1. Writes their rows and
    returns logits [len(rows), V] of each chunk's last token (`last_only`), else [T, V]."""
    torch = require("torch", "generation on CUDA")
    from edgeattn.attention.cached_torch import cached_windowed_attention

    F, s, t, dev = torch.nn.functional, w.shape, w.t, ids.device
    lengths, starts = np.asarray(lengths, dtype=np.int64), np.asarray(starts, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    live = s.window_max if window <= 0 or window > s.window_max else int(window)
    pos = np.concatenate([st + np.arange(n) for st, n in zip(starts, lengths)])  # [T] each token's position
    slot = np.where(pos < s.sinks, pos, s.sinks + (pos - s.sinks) % s.window_max)
    stream = np.repeat(np.asarray(rows, dtype=np.int64), lengths)
    plain = starts + lengths <= min(s.capacity, s.sinks + live)  # every query reads every earlier row
    kinds = {"first": [i for i in range(len(rows)) if plain[i] and starts[i] == 0],
             "later": [i for i in range(len(rows)) if plain[i] and starts[i] > 0],
             "ring": [i for i in range(len(rows)) if not plain[i]]}
    groups = {k: _Group(torch, m, offsets, lengths, dev) for k, m in kinds.items() if m}
    written = np.repeat(plain, lengths)  # tokens whose rows are written before attention
    before = (torch.as_tensor(stream[written], device=dev), torch.as_tensor(slot[written], device=dev),
              torch.as_tensor(np.flatnonzero(written), device=dev))
    after = (torch.as_tensor(stream[~written], device=dev), torch.as_tensor(slot[~written], device=dev),
             torch.as_tensor(np.flatnonzero(~written), device=dev))
    positions = torch.as_tensor(pos, device=dev)
    cos, sin = _angles(torch, w.inv_freq, positions, w.rope_scaling, w.dtype)
    cos_s, sin_s = _angles(torch, w.inv_freq, torch.clamp(positions, max=s.sinks + live), w.rope_scaling, w.dtype)
    extra = {}
    if "later" in groups:  # key l of chunk i's query j: l <= starts[i] + j
        g = groups["later"]
        ends = torch.as_tensor(starts[g.members], device=dev)[:, None, None, None]
        span = int(max(starts[i] + lengths[i] for i in g.members))
        extra["later"] = (torch.as_tensor(np.asarray(rows)[g.members], device=dev), span,
                          torch.arange(span, device=dev) <= ends + torch.arange(g.longest, device=dev)[:, None])
    if "ring" in groups:
        g = groups["ring"]
        extra["ring"] = (torch.as_tensor(np.asarray(rows)[g.members], device=dev),
                         torch.as_tensor(starts[g.members], device=dev), torch.tensor(int(window), device=dev))
    h = F.embedding(ids, t["embed"])  # h: [T, hidden]
    for i in range(s.layers):
        q, q_s, k, v = layer_head(h, t["ln1"][i], t["wqkv"][i], t["bqkv"][i], t["qn"][i], t["kn"][i], cos, sin,
                                  cos_s, sin_s, shape=s)  # q: [T, H, D]; k, v: [T, H_kv, D]
        kc, vc = keys[i], values[i]  # [streams, H_kv, C, D]
        ks, vs = fp8_cache.layer_scales(w, i)  # an FP8 cache: attention sees the rows as the cache keeps them
        k_sinks, v_sinks = fp8_cache.sink_buffers(keys, values, i)  # its float sink rows (fp8_cache.Layers)
        if ks is not None:
            kept = None if k_sinks is None else positions < s.sinks
            k, v = fp8_cache.roundtrip(k, ks, kept), fp8_cache.roundtrip(v, vs, kept)
        _write(kc, vc, k, v, before, ks, vs, k_sinks, v_sinks)
        o = torch.empty_like(q)
        for kind, g in groups.items():
            if kind == "first":
                out = F.scaled_dot_product_attention(g.pad(q), g.pad(k), g.pad(v), is_causal=True, scale=s.scale,
                                                     enable_gqa=True)
            elif kind == "later":
                members, span, mask = extra["later"]
                past_k = _heads(_read(kc[members, :, :span], ks, q.dtype, _rows(k_sinks, members)), s)
                past_v = _heads(_read(vc[members, :, :span], vs, q.dtype, _rows(v_sinks, members)), s)
                out = F.scaled_dot_product_attention(g.pad(q), past_k, past_v, attn_mask=mask, scale=s.scale)
            else:
                members, cache_position, wt = extra["ring"]
                past_k = _read(kc[members], ks, q.dtype, _rows(k_sinks, members))
                past_v = _read(vc[members], vs, q.dtype, _rows(v_sinks, members))
                out = cached_windowed_attention(g.pad(q), g.pad(q_s), g.pad(k), g.pad(v), past_k, past_v,
                                                cache_position, wt, sinks=s.sinks, scale=s.scale)
            g.unpad_into(o, out)
        _write(kc, vc, k, v, after, ks, vs, k_sinks, v_sinks)
        h = layer_tail(h, o, t["wo"][i], t["ln2"][i], t["wgu"][i], t["wd"][i], shape=s)
    if last_only:
        h = h[torch.as_tensor(offsets + lengths - 1, device=dev)]
    return F.linear(_rms_norm(torch, h, t["norm"], s.eps), t["lm_head"])


def _write(kc, vc, k, v, where, k_scale=None, v_scale=None, k_sinks=None, v_sinks=None) -> None:
    """Rows of some packed tokens into their streams' cache rows (in place; FP8 with the scales, the sink rows
    also into the float sink buffers)."""
    streams, slots, tokens = where
    if tokens.numel():
        fp8_cache.store(kc, streams, slots, k[tokens], k_scale, k_sinks)
        fp8_cache.store(vc, streams, slots, v[tokens], v_scale, v_sinks)


def _rows(buffers, members):
    return None if buffers is None else buffers[members]


def _read(rows, scale, dtype, sinks=None):
    """Cache rows [n, H_kv, L, D] from row 0 in `dtype` (an FP8 cache's dequantized, its sink rows from `sinks`)."""
    return rows if scale is None else fp8_cache.load(rows, scale, dtype, sinks)


def _heads(x, s):
    """[n, H_kv, L, D] -> [n, H, L, D]: each kv head repeated for its query heads (a masked attention kernel
    that takes grouped heads is not on every device)."""
    n, hk, length, d = x.shape
    return x[:, :, None].expand(n, hk, s.heads // hk, length, d).reshape(n, s.heads, length, d)
