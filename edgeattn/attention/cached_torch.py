"""edgeattn::CachedWindowedAttention in PyTorch: eager compute on any device, and export to the ONNX op.

Eagerly it computes what the ONNX body computes (`cached_function`), vectorised the same way: sink rows
with q_sink, the W ring rows before the chunk gathered by slot, the chunk's own keys causally. Under
`torch.onnx.export(..., dynamo=True)` it emits one `edgeattn::CachedWindowedAttention` node.
"""

from __future__ import annotations

import torch

from edgeattn.attention import DOMAIN, OPSET_VERSION
from edgeattn.attention.cached_function import CACHED_OP_TYPE
from edgeattn.errors import InputError


def check_cached_inputs(q, k, past_key, cache_position, sinks: int) -> None:
    b, h, s, d = q.shape
    if past_key.dim() != 4 or past_key.shape[0] != b or past_key.shape[3] != d:
        raise InputError(f"past_key: expected [B={b}, H_kv, C, D={d}], found {tuple(past_key.shape)}")
    if tuple(k.shape) != (b, past_key.shape[1], s, d):
        raise InputError(f"k: expected [B, H_kv, S, D] = {(b, past_key.shape[1], s, d)}, found {tuple(k.shape)}")
    wmax = past_key.shape[2] - sinks
    if wmax < 1 or s > wmax:
        raise InputError(f"cache: expected at least sinks + S rows ({sinks} + {s}), found {past_key.shape[2]}")
    if tuple(cache_position.shape) != (b,):
        raise InputError(f"cache_position: expected [B] = [{b}], found {tuple(cache_position.shape)}")


def cached_windowed_attention(q, q_sink, k, v, past_key, past_value, cache_position, window, pages=None,
                              key_bounds=None, *, sinks: int, scale: float = 0.0, softcap: float = 0.0):
    """q, q_sink: [B, H, S, D]; k, v: [B, H_kv, S, D]; past_key/value: [B, H_kv, C, D]; cache_position [B];
    window: int64 scalar tensor (0 = C - sinks) -> [B, H, S, D]. softcap c > 0: scores s become c * tanh(s / c).
    pages (int64 scalar) and key_bounds [B, H_kv, P, 2, D]: the attention budget (both or neither; None = k 0)."""
    if (pages is None) != (key_bounds is None):
        raise InputError("pages and key_bounds: expected both (the attention budget) or neither, found one")
    if torch.onnx.is_in_onnx_export():
        w = window.reshape(()).to(torch.int64)
        attrs = {"sinks": int(sinks), "scale": float(scale), "plugin_namespace": DOMAIN}
        if softcap:  # only when set: graphs without it keep the attributes every consumer knows
            attrs["softcap"] = float(softcap)
        extra = [pages.reshape(()).to(torch.int64), key_bounds] if pages is not None else []
        return torch.onnx.ops.symbolic(f"{DOMAIN}::{CACHED_OP_TYPE}",
                                       [q, q_sink, k, v, past_key, past_value, cache_position, w, *extra], attrs,
                                       dtype=q.dtype, shape=q.shape, version=OPSET_VERSION)
    check_cached_inputs(q, k, past_key, cache_position, sinks)
    if key_bounds is not None:
        check_bounds(key_bounds, past_key, sinks)
    return _eager(q, q_sink, k, v, past_key, past_value, cache_position, window, sinks, scale, softcap,
                  pages=0 if pages is None else int(pages), key_bounds=key_bounds)


def check_bounds(key_bounds, past_key, sinks: int) -> None:
    b, h_kv, c, d = past_key.shape
    p = key_bounds.shape[2] if key_bounds.dim() == 5 else 0
    if tuple(key_bounds.shape) != (b, h_kv, p, 2, d) or p < 1 or (c - sinks) % p:
        raise InputError(f"key_bounds: expected [B={b}, H_kv={h_kv}, P, 2, D={d}] with P dividing the ring's "
                         f"{c - sinks} rows, found {tuple(key_bounds.shape)}")


def _eager(q, q_sink, k, v, past_key, past_value, cache_position, window, sinks, scale, softcap=0.0, *, pages=0,
           key_bounds=None):
    b, h, s, d = q.shape
    h_kv, c = past_key.shape[1], past_key.shape[2]
    g, wmax, dev = h // h_kv, c - sinks, q.device
    w = int(window)
    w = wmax if w <= 0 or w > wmax else w
    scale = scale or d ** -0.5
    pos = cache_position.to(dev, torch.int64).reshape(b, 1)  # [B, 1]
    n = max(min(w, int(pos.max()) - sinks), 1)  # ring rows read: the last min(W, filled) (see cached_function)
    r = torch.arange(n, device=dev)
    kpos_w = pos - n + r  # [B, N]
    slot_w = sinks + torch.remainder(kpos_w - sinks, wmax)
    valid_w = (kpos_w >= sinks) & (kpos_w >= 0)
    idx = slot_w[:, None, :, None].expand(b, h_kv, n, d)
    kw, vw = past_key.gather(2, idx).float(), past_value.gather(2, idx).float()  # [B, H_kv, N, D]
    ns = max(sinks, 1)
    ks, vs = past_key[:, :, :ns].float(), past_value[:, :, :ns].float()  # [B, H_kv, NS, D]
    valid_s = (torch.arange(ns, device=dev) < sinks) & (torch.arange(ns, device=dev) < pos)  # [B, NS]
    qi, kj = torch.arange(s, device=dev)[:, None], torch.arange(s, device=dev)[None, :]
    ok_w = valid_w[:, None, :] & ((qi + n - r[None, :]) < w)  # [B, S, N]: t - p = i + n - r < W
    ok_s = valid_s[:, None, :].expand(b, s, ns)
    ok_n = (kj <= qi) & (((qi - kj) < w) | ((pos + kj) < sinks)[:, None, :])  # [B, S, S]
    qg = (q.float() * scale).reshape(b, h_kv, g * s, d)
    qsg = (q_sink.float() * scale).reshape(b, h_kv, g * s, d)
    parts = ((qsg, ks, vs, ok_s), (qg, kw, vw, ok_w), (qg, k.float(), v.float(), ok_n))
    raw = [(qq @ kk.transpose(-1, -2)).reshape(b, h_kv, g, s, -1) for qq, kk, _, _ in parts]
    if softcap:
        raw = [torch.tanh(x / softcap) * softcap for x in raw]
    scores = [x.masked_fill(~ok[:, None, None], float("-inf")) for x, (_, _, _, ok) in zip(raw, parts)]
    values = torch.cat([vv for _, _, vv, _ in parts], dim=2)  # [B, H_kv, L, D]
    if pages > 0:
        ps, pvals = _page_group(q, scale, past_key, past_value, pos, key_bounds, pages, w, sinks, softcap)
        weights = torch.softmax(torch.cat(scores + [ps], dim=-1), dim=-1)
        wl, wp = weights[..., :values.shape[2]], weights[..., values.shape[2]:]
        out = wl.reshape(b, h_kv, g * s, -1) @ values  # [B, H_kv, G*S, D]
        out = out + (wp.transpose(2, 3) @ pvals).transpose(2, 3).reshape(b, h_kv, g * s, d)
        return out.reshape(b, h, s, d).to(q.dtype)
    weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1)  # every row reads its own key: no empty rows
    out = weights.reshape(b, h_kv, g * s, -1) @ values  # [B, H_kv, G*S, D]
    return out.reshape(b, h, s, d).to(q.dtype)


def _page_group(q, scale, past_key, past_value, pos, key_bounds, pages, w, sinks, softcap):
    """The budget's pages, as the ONNX body reads them (cached_function._page_group): per query and KV head the
    k best candidate pages by q . the centre of their key bounds, their rows gathered. -> scores [B, H_kv, G, S, R]
    (-inf where not read), values [B, H_kv, S, R, D]; R = min(k, P) * page."""
    b, h, s, d = q.shape
    h_kv, c, npages = past_key.shape[1], past_key.shape[2], key_bounds.shape[2]
    g, wmax, dev = h // h_kv, c - sinks, q.device
    page, kk = wmax // npages, min(pages, npages)
    t = pos + torch.arange(s, device=dev)  # [B, S]
    lo = torch.clamp(pos - wmax, min=sinks)  # [B, 1]: the oldest past ring position held
    span = (torch.minimum(pos - 1, t - w) - lo + 1)[:, :, None]  # [B, S, 1]: candidates lo .. hi, if > 0
    s0 = torch.remainder(lo - sinks, wmax)[:, :, None]  # [B, 1, 1]: ring offset of lo
    start = torch.arange(npages, device=dev) * page  # [P]
    cand = (torch.remainder(start - s0, wmax) < span) | (torch.remainder(s0 - start, wmax) < page)
    cand = (cand & (span > 0))[:, None]  # [B, 1, S, P]
    qr = q.float().reshape(b, h_kv, g * s, d)
    lo_b, hi_b = key_bounds[:, :, :, 0].float(), key_bounds[:, :, :, 1].float()  # [B, H_kv, P, D]
    centre = (lo_b + hi_b).to(key_bounds.dtype).float() * 0.5  # rounded once to the bounds' dtype, as the kernels
    bound = qr @ centre.transpose(-1, -2)  # q . the centre of each page's key bounds
    bound = bound.reshape(b, h_kv, g, s, npages).amax(dim=2).masked_fill(~cand, float("-inf"))  # [B, H_kv, S, P]
    best, chosen = torch.sort(bound, dim=-1, descending=True, stable=True)  # ties: the lower page first
    best, chosen = best[..., :kk], chosen[..., :kk]  # [B, H_kv, S, k']
    o = (chosen[..., None] * page + torch.arange(page, device=dev)).reshape(b, h_kv, s, kk * page)  # ring offsets
    last = (pos - 1 - sinks)[:, :, None, None]  # [B, 1, 1, 1]: the newest ring offset
    held = last - torch.remainder(last - o, wmax)  # [B, H_kv, S, R]: ring offset of the token each row holds
    taken = (best > float("-inf"))[..., None].expand(b, h_kv, s, kk, page).reshape(b, h_kv, s, kk * page)
    ok = taken & (held >= 0) & (t[:, None, :, None] - (held + sinks) >= w)
    rows = (sinks + o).reshape(b, h_kv, s * kk * page, 1).expand(-1, -1, -1, d)
    kp = past_key.gather(2, rows).float().reshape(b, h_kv, s, kk * page, d)  # only the chosen pages' rows
    vp = past_value.gather(2, rows).float().reshape(b, h_kv, s, kk * page, d)
    qs = (q.float() * scale).reshape(b, h_kv, g, s, d).transpose(2, 3)  # [B, H_kv, S, G, D]
    sc = qs @ kp.transpose(-1, -2)  # [B, H_kv, S, G, R]
    if softcap:
        sc = torch.tanh(sc / softcap) * softcap
    sc = sc.masked_fill(~ok[:, :, :, None], float("-inf"))
    return sc.transpose(2, 3), vp


def write_ring_(past_key, past_value, k, v, cache_position, sinks: int) -> None:
    """Write the chunk's keys and values into their rows, in place. k, v: [B, H_kv, S, D]."""
    b, _, s, d = k.shape
    wmax = past_key.shape[2] - sinks
    p = cache_position.to(k.device, torch.int64).reshape(b, 1) + torch.arange(s, device=k.device)  # [B, S]
    rows = torch.where(p < sinks, p, sinks + torch.remainder(p - sinks, wmax))
    idx = rows[:, None, :, None].expand(b, past_key.shape[1], s, d)
    past_key.scatter_(2, idx, k.to(past_key.dtype))
    past_value.scatter_(2, idx, v.to(past_value.dtype))
