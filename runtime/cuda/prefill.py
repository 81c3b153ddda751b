"""A prefill chunk of one stream on the GPU, with the decode step's packed weights (decode_step.PackedDecoder).

While every query of the chunk sees the whole stream (no ring wrap and t < sinks + W for its last token),
cached attention is causal attention over cache rows [0, p0 + S): the chunk's rows are written first and one
scaled-dot-product-attention call (flash where it applies) reads them. Past that, the chunk goes through the
op's reference semantics (edgeattn.attention.cached_torch), which gathers the sinks and the last W ring rows.
"""

from __future__ import annotations

from edgeattn.optional import require
from edgeattn.runtime.cuda.decode_step import PackedDecoder, _angles, _rms_norm, layer_head, layer_tail


def prefill_logits(w: PackedDecoder, ids, start: int, window: int, keys, values, row: int, *, last_only=True):
    """ids: [S] int64 on the device, the tokens at positions start .. start + S - 1 of cache row `row`.
    Writes their rows and returns logits [1 or S, V]."""
    torch = require("torch", "generation on CUDA")
    from edgeattn.attention.cached_torch import cached_windowed_attention

    F, s, t = torch.nn.functional, w.shape, w.t
    n = ids.shape[0]
    live = s.window_max if window <= 0 or window > s.window_max else int(window)
    positions = torch.arange(start, start + n, device=ids.device)
    cos, sin = _angles(torch, w.inv_freq, positions, w.rope_scaling, w.dtype)
    cos_s, sin_s = _angles(torch, w.inv_freq, torch.clamp(positions, max=s.sinks + live), w.rope_scaling, w.dtype)
    rows = torch.where(positions < s.sinks, positions, s.sinks + torch.remainder(positions - s.sinks, s.window_max))
    plain = start + n <= min(s.capacity, s.sinks + live)  # every query reads every earlier row
    h = F.embedding(ids, t["embed"])  # h: [S, hidden]
    for i in range(s.layers):
        q, q_s, k, v = layer_head(h, t["ln1"][i], t["wqkv"][i], t["bqkv"][i], t["qn"][i], t["kn"][i], cos, sin,
                                  cos_s, sin_s, shape=s)  # q: [S, H, D]; k, v: [S, H_kv, D]
        kc, vc = keys[i][row:row + 1], values[i][row:row + 1]  # [1, H_kv, C, D]
        qh = q.transpose(0, 1)[None]  # [1, H, S, D]
        kh, vh = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, H_kv, S, D]
        if plain:
            kc[0][:, rows] = kh[0]
            vc[0][:, rows] = vh[0]
            end = start + n
            if start == 0:
                o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=s.scale, enable_gqa=True)
            else:
                mask = torch.ones(n, end, dtype=torch.bool, device=ids.device).tril(diagonal=start)
                o = F.scaled_dot_product_attention(qh, kc[:, :, :end], vc[:, :, :end], attn_mask=mask,
                                                   scale=s.scale, enable_gqa=True)
        else:
            o = cached_windowed_attention(qh, q_s.transpose(0, 1)[None], kh, vh, kc, vc,
                                          torch.tensor([start], device=ids.device),
                                          torch.tensor(window, device=ids.device), sinks=s.sinks, scale=s.scale)
            kc[0][:, rows] = kh[0]
            vc[0][:, rows] = vh[0]
        h = layer_tail(h, o[0].transpose(0, 1), t["wo"][i], t["ln2"][i], t["wgu"][i], t["wd"][i], shape=s)
    if last_only:
        h = h[-1:]
    return F.linear(_rms_norm(torch, h, t["norm"], s.eps), t["lm_head"])
