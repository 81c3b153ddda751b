"""The portable body of edgeattn::CachedWindowedAttention: standard ONNX ops, work proportional to sinks + W.

Inputs: q, q_sink [B, H, S, D]; k, v [B, H_kv, S, D] (the new tokens); past_key, past_value [B, H_kv, C, D]
(the sinks + ring cache, `edgeattn.attention.ring`); cache_position [B] (tokens already in each stream);
window (int64 scalar, 0 = the ring's size). Attributes: sinks, scale (0 = 1/sqrt(D)), softcap (0 = none;
c > 0: every score s becomes c * tanh(s / c) before the mask, Gemma 2's attention logit soft-capping).
Output: out [B, H, S, D]. The cache is read, never written: the runtime writes the new rows into its
buffers in place (`cached_reference.write_ring`), so no step copies the cache.

Each query block reads three groups of keys: the sink rows (with q_sink), the W ring rows just before the
chunk (GatherElements on their slots, computed from cache_position at run time), and the chunk's own keys
(causal). So the work per token is sinks + W + S keys, not C and not the stream's length.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgeattn.attention import DOMAIN
from edgeattn.attention.onnx_function import _Body, make_function

CACHED_OP_TYPE = "CachedWindowedAttention"
CACHED_INPUTS = ("q", "q_sink", "k", "v", "past_key", "past_value", "cache_position", "window")
BUDGET_INPUTS = ("pages", "key_bounds")  # the attention budget's optional inputs, after `window`
CACHED_ATTRIBUTES = {"sinks": 0, "scale": 0.0, "softcap": 0.0, "plugin_namespace": DOMAIN}


def _build_cached(b: _Body, budget: bool = False, pages_max: int = 0) -> str:
    """Shapes in comments: G = H / H_kv, N = ring rows read (<= W), NS = max(sinks, 1) sink rows read.
    budget: the body also reads the inputs `pages` and `key_bounds` (a fourth group of keys, `_page_group`)."""
    i0, i1 = b.const(0), b.const(1)
    sinks = b.attr_const("sinks", onnx.AttributeProto.INT)
    scale_attr = b.attr_const("scale", onnx.AttributeProto.FLOAT)
    cap = b.attr_const("softcap", onnx.AttributeProto.FLOAT)
    no_cap = b.Equal(cap, b.const(0.0, np.float32))
    cap_safe = b.Where(no_cap, b.const(1.0, np.float32), cap)
    qf, qsf, kf, vf = (b.Cast(x, to=TensorProto.FLOAT) for x in ("q", "q_sink", "k", "v"))
    pk, pv = "past_key", "past_value"  # rows are cast after they are gathered: no op reads the whole cache
    q_shape, c_shape = b.Shape("q"), b.Shape("past_key")
    bsz, h, sq, d = (b.dim(q_shape, i) for i in range(4))
    hkv, c = b.dim(c_shape, 1), b.dim(c_shape, 2)
    g = b.Div(h, hkv)
    wmax = b.Sub(c, sinks)
    w = b.Reshape("window", b.const([], np.int64))
    w = b.Where(b.Or(b.LessOrEqual(w, i0), b.Greater(w, wmax)), wmax, w)
    pos = b.Reshape(b.Cast("cache_position", to=TensorProto.INT64), b.vec(bsz, i1),
                    check="expected cache_position [B]")  # [B, 1]
    d_f = b.Cast(d, to=TensorProto.FLOAT)
    scale = b.Where(b.Equal(scale_attr, b.const(0.0, np.float32)), b.Reciprocal(b.Sqrt(d_f)), scale_attr)
    # ring rows before the chunk: the last n = min(W, filled ring rows) positions pos - n .. pos - 1 (at least
    # one row: zero-sized tensors break older ORT), at rows sinks + (p - sinks) mod Wmax. A short stream
    # reads only what it has written, whatever the ring's size.
    filled = b.Sub(b.ReduceMax(pos, keepdims=0), sinks)
    n = b.Max(b.Min(w, filled), i1)
    r = b.Range(i0, n, i1)  # [N]
    kpos_w = b.Add(b.Sub(pos, n), b.Unsqueeze(r, b.const([0])))  # [B, N]
    slot_w = b.Add(sinks, b.Mod(b.Sub(kpos_w, sinks), wmax))  # Mod (fmod=0) of an int is >= 0 for Wmax > 0
    valid_w = b.And(b.GreaterOrEqual(kpos_w, sinks), b.GreaterOrEqual(kpos_w, i0))  # [B, N]
    # one Gather of whole rows from the cache seen as [B*H_kv*C, D] (a free Reshape): row (b*H_kv + h)*C + slot.
    # Its index is [B, H_kv, N], D times smaller than GatherElements' would be, and each row is one copy.
    bh = b.Reshape(b.Range(i0, b.Mul(bsz, hkv), i1), b.vec(bsz, hkv, i1))  # [B, H_kv, 1]
    rows = b.Add(b.Mul(bh, c), b.Unsqueeze(slot_w, b.const([1])))  # [B, H_kv, N]
    flat = b.vec(b.const(-1), d)
    kw = b.Cast(b.Gather(b.Reshape(pk, flat), rows, axis=0), to=TensorProto.FLOAT)  # [B, H_kv, N, D]
    vw = b.Cast(b.Gather(b.Reshape(pv, flat), rows, axis=0), to=TensorProto.FLOAT)
    # sink rows: at least one row is read even without sinks (then masked): zero-sized tensors break older ORT
    ns = b.Max(sinks, i1)
    ks = b.Cast(b.Slice(pk, b.const([0]), b.Unsqueeze(ns, b.const([0])), b.const([2])), to=TensorProto.FLOAT)
    vs = b.Cast(b.Slice(pv, b.const([0]), b.Unsqueeze(ns, b.const([0])), b.const([2])), to=TensorProto.FLOAT)
    kpos_s = b.Unsqueeze(b.Range(i0, ns, i1), b.const([0]))  # [1, NS]
    valid_s = b.And(b.Less(kpos_s, sinks), b.Less(kpos_s, pos))  # [B, NS]: a sink row is filled once pos > j
    # masks as additive biases, [B, 1, 1, S, L]: broadcast over the KV heads and the G query heads
    qi = b.Unsqueeze(b.Range(i0, sq, i1), b.const([1]))  # [S, 1]
    dist = b.Sub(b.Add(qi, n), b.Unsqueeze(r, b.const([0])))  # [S, N]: t - p = i + n - r
    ok_w = b.And(b.Unsqueeze(valid_w, b.const([1])), b.Less(dist, w))
    ok_s = b.Unsqueeze(valid_s, b.const([1]))  # [B, 1, NS]
    kj = b.Unsqueeze(b.Range(i0, sq, i1), b.const([0]))  # [1, S]
    new_pos = b.Add(pos, kj)  # [B, S] positions of the chunk's keys
    in_band = b.Or(b.Less(b.Sub(qi, kj), w), b.Unsqueeze(b.Less(new_pos, sinks), b.const([1])))  # [B, S, S]
    ok_n = b.And(b.LessOrEqual(kj, qi), in_band)
    zero, neg_inf = b.const(0.0, np.float32), b.const(-np.inf, np.float32)
    biases = [b.Unsqueeze(b.Where(ok, zero, neg_inf), b.const([1, 2])) for ok in (ok_s, ok_w, ok_n)]
    # scores per group; the G query heads that share a KV head are stacked into one GEMM
    qg = b.Reshape(b.Mul(qf, scale), b.vec(bsz, hkv, b.Mul(g, sq), d),
                   check="expected q [B, H, S, D] with H a multiple of the cache's H_kv")
    qsg = b.Reshape(b.Mul(qsf, scale), b.vec(bsz, hkv, b.Mul(g, sq), d), check="expected q_sink of q's shape")
    kn = b.Reshape(kf, b.vec(bsz, hkv, sq, d), check="expected k [B, H_kv, S, D] matching q and the cache")
    vn = b.Reshape(vf, b.vec(bsz, hkv, sq, d), check="expected v [B, H_kv, S, D] matching k")
    groups = ((qsg, ks, vs), (qg, kw, vw), (qg, kn, vn))
    capped = lambda s: b.Where(no_cap, s, b.Mul(b.Tanh(b.Div(s, cap_safe)), cap_safe))  # noqa: E731 - 0: none
    scores = []
    for (query, key, _), bias in zip(groups, biases):
        s = capped(b.MatMul(query, b.Transpose(key, perm=[0, 1, 3, 2])))  # [B, H_kv, G*S, L]
        scores.append(b.Add(b.Reshape(s, b.vec(bsz, hkv, g, sq, b.const(-1))), bias))  # [B, H_kv, G, S, L]
    if budget:
        dims = dict(bsz=bsz, hkv=hkv, g=g, sq=sq, d=d, c=c, wmax=wmax, sinks=sinks, w=w, pos=pos, bh=bh, qi=qi)
        page_scores, page_values = _page_group(b, qf, scale, pk, pv, capped, pages_max=pages_max, **dims)
    m = scores[0]
    m = b.reduce("ReduceMax", scores[0], -1)
    for s in scores[1:] + ([page_scores] if budget else []):
        m = b.Max(m, b.reduce("ReduceMax", s, -1))  # finite: every row reads its own key
    exps = [b.Exp(b.Sub(s, m)) for s in scores]
    denom = b.Add(b.Add(*(b.reduce("ReduceSum", e, -1) for e in exps[:2])), b.reduce("ReduceSum", exps[2], -1))
    num = None
    for e, (_, _, value) in zip(exps, groups):
        part = b.MatMul(b.Reshape(e, b.vec(bsz, hkv, b.Mul(g, sq), b.const(-1))), value)  # [B, H_kv, G*S, D]
        num = part if num is None else b.Add(num, part)
    if budget:  # k = 0: every page row is masked, so these add exact zeros (the same result, bit for bit)
        e = b.Exp(b.Sub(page_scores, m))  # [B, H_kv, G, S, R]
        denom = b.Add(denom, b.reduce("ReduceSum", e, -1))
        part = b.MatMul(b.Transpose(e, perm=[0, 1, 3, 2, 4]), page_values)  # [B, H_kv, S, G, D]
        num = b.Add(num, b.Reshape(b.Transpose(part, perm=[0, 1, 3, 2, 4]), b.vec(bsz, hkv, b.Mul(g, sq), d)))
    o = b.Div(b.Reshape(num, b.vec(bsz, hkv, g, sq, d)), denom)  # [B, H_kv, G, S, D]
    o = b.Reshape(o, b.vec(bsz, h, sq, d))
    return b.CastLike(o, "q")


def _top_k(b: _Body, x: str, k: str) -> tuple[str, str]:
    """TopK on the last axis, largest first; equal values: the lower index first (the ONNX spec)."""
    values, indices = f"_topk_values{len(b.nodes)}", f"_topk_indices{len(b.nodes)}"
    b.nodes.append(helper.make_node("TopK", [x, k], [values, indices], axis=-1, largest=1, sorted=1))
    return values, indices


def _page_group(b: _Body, qf, scale, pk, pv, capped, *, pages_max, bsz, hkv, g, sq, d, c, wmax, sinks, w, pos, bh,
                qi):
    """The budget's pages: per query and KV head, TopK of the candidate pages' bound scores, then the chosen
    pages' rows gathered (R = k' * page rows a query, k' = max(min(k, P), 1), or the constant pages_max when
    given: TensorRT's parser wants TopK's k constant). -> scores [B, H_kv, G, S, R] (masked to -inf where a row
    is not read) and values [B, H_kv, S, R, D]."""
    i0, i1 = b.const(0), b.const(1)
    kb = b.Cast("key_bounds", to=TensorProto.FLOAT)  # [B, H_kv, P, 2, D]
    npages = b.dim(b.Shape("key_bounds"), 2)
    page = b.Div(wmax, npages)  # the bounds' pages cut the ring evenly (page divides W_max)
    k = b.Reshape("pages", b.const([], np.int64))
    kk = b.const(pages_max) if pages_max else b.Max(b.Min(k, npages), i1)  # >= 1: zero-sized tensors break old ORT
    # candidates, from positions alone: past ring rows p in [lo, hi], hi = min(pos - 1, t - W), cover the ring
    # offsets [s0, s0 + L) mod W_max; page j (offsets [j*page, (j+1)*page)) holds one iff either interval's
    # start lies in the other
    lo = b.Max(b.Sub(pos, wmax), sinks)  # [B, 1]
    t = b.Add(pos, b.Unsqueeze(b.Range(i0, sq, i1), b.const([0])))  # [B, S]
    span = b.Add(b.Sub(b.Min(b.Sub(pos, i1), b.Sub(t, w)), lo), i1)  # [B, S]: L (<= 0: no candidate)
    s0 = b.Mod(b.Sub(lo, sinks), wmax)  # [B, 1]
    start = b.Mul(b.Range(i0, npages, i1), page)  # [P]
    s0_, span_ = b.Unsqueeze(s0, b.const([2])), b.Unsqueeze(span, b.const([2]))  # [B, 1, 1], [B, S, 1]
    cand = b.Or(b.Less(b.Mod(b.Sub(start, s0_), wmax), span_), b.Less(b.Mod(b.Sub(s0_, start), wmax), page))
    cand = b.Unsqueeze(b.And(cand, b.Greater(span_, i0)), b.const([1]))  # [B, 1, S, P]
    # a page's score: q . the centre of its key bounds, (min + max) / 2; the largest over the group
    centre = b.Mul(b.ReduceSum(kb, b.const([3]), keepdims=0), b.const(0.5, np.float32))  # [B, H_kv, P, D]
    qr = b.Reshape(qf, b.vec(bsz, hkv, b.Mul(g, sq), d))
    bound = b.MatMul(qr, b.Transpose(centre, perm=[0, 1, 3, 2]))  # [B, H_kv, G*S, P]
    bound = b.ReduceMax(b.Reshape(bound, b.vec(bsz, hkv, g, sq, npages)), b.const([2]), keepdims=0)  # [B,H_kv,S,P]
    neg_inf = b.const(-np.inf, np.float32)
    k_in = b.const([pages_max]) if pages_max else b.Unsqueeze(kk, b.const([0]))  # a Constant node for TensorRT
    best, chosen = _top_k(b, b.Where(cand, bound, neg_inf), k_in)  # [B, H_kv, S, k']
    taken = b.And(b.Greater(best, neg_inf), b.Less(b.Range(i0, kk, i1), k))  # a candidate, and one of the k
    # the chosen pages' rows: ring offset o = page index * page + r; the position it holds, from pos
    o = b.Add(b.Unsqueeze(b.Mul(chosen, page), b.const([4])), b.Range(i0, page, i1))  # [B, H_kv, S, k', page]
    rshape = b.vec(bsz, hkv, sq, b.Mul(kk, page))
    o = b.Reshape(o, rshape)  # [B, H_kv, S, R]
    last = b.Unsqueeze(b.Sub(b.Sub(pos, i1), sinks), b.const([1, 2]))  # [B, 1, 1, 1]: newest ring offset
    held = b.Sub(last, b.Mod(b.Sub(last, o), wmax))  # ring offset (p - sinks) of the token in row sinks + o
    t_ = b.Unsqueeze(t, b.const([1, 3]))  # [B, 1, S, 1]
    page_ok = b.Reshape(b.Expand(b.Unsqueeze(taken, b.const([4])), b.vec(bsz, hkv, sq, kk, page)), rshape)
    ok = b.And(b.And(b.GreaterOrEqual(held, i0), b.GreaterOrEqual(b.Sub(t_, b.Add(held, sinks)), w)), page_ok)
    rows = b.Add(b.Mul(b.Unsqueeze(bh, b.const([3])), c), b.Add(o, sinks))  # [B, H_kv, S, R] rows of [B*H_kv*C, D]
    flat = b.vec(b.const(-1), d)
    kp = b.Cast(b.Gather(b.Reshape(pk, flat), rows, axis=0), to=TensorProto.FLOAT)  # [B, H_kv, S, R, D]
    vp = b.Cast(b.Gather(b.Reshape(pv, flat), rows, axis=0), to=TensorProto.FLOAT)  # only the chosen pages' rows
    qs = b.Transpose(b.Reshape(b.Mul(qf, scale), b.vec(bsz, hkv, g, sq, d)), perm=[0, 1, 3, 2, 4])  # [B,H_kv,S,G,D]
    s = capped(b.MatMul(qs, b.Transpose(kp, perm=[0, 1, 2, 4, 3])))  # [B, H_kv, S, G, R]
    s = b.Where(b.Unsqueeze(ok, b.const([3])), s, neg_inf)
    return b.Transpose(s, perm=[0, 1, 3, 2, 4]), vp  # [B, H_kv, G, S, R], [B, H_kv, S, R, D]


def cached_function_proto(opset: int = 18, *, budget: bool = False, pages_max: int = 0) -> onnx.FunctionProto:
    """The local function edgeattn::CachedWindowedAttention against the default-domain `opset` (>= 18).
    budget: the form with the attention budget's inputs `pages` and `key_bounds` (BUDGET_INPUTS).
    pages_max > 0 (with budget): TopK takes that constant k_max and masks the pages past the run-time k, for
    parsers that want TopK's k constant (TensorRT); the ring must hold at least pages_max pages, and a k above
    pages_max reads pages_max pages."""
    if opset < 18:
        raise ValueError(f"the cached op's body needs opset >= 18, found {opset}")
    if pages_max < 0 or (pages_max and not budget):
        raise ValueError(f"pages_max: expected 0, or >= 1 with budget=True, found {pages_max}")
    b = _Body(opset)
    inputs = CACHED_INPUTS + (BUDGET_INPUTS if budget else ())
    return make_function(b, _build_cached(b, budget, pages_max), CACHED_OP_TYPE, inputs, CACHED_ATTRIBUTES)


def make_cached_node(inputs: list[str], *, out: str, sinks: int, scale: float = 0.0, softcap: float = 0.0,
                     name: str | None = None) -> onnx.NodeProto:
    """inputs: CACHED_INPUTS, or CACHED_INPUTS + BUDGET_INPUTS (the attention budget)."""
    if len(inputs) not in (len(CACHED_INPUTS), len(CACHED_INPUTS) + len(BUDGET_INPUTS)):
        raise ValueError(f"expected inputs {CACHED_INPUTS} (+ {BUDGET_INPUTS}), found {len(inputs)}")
    extra = {"softcap": float(softcap)} if softcap else {}  # written only when set: other graphs stay as they were
    return helper.make_node(CACHED_OP_TYPE, inputs, [out], name=name, domain=DOMAIN, sinks=int(sinks),
                            scale=float(scale), plugin_namespace=DOMAIN, **extra)
