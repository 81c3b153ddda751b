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
CACHED_ATTRIBUTES = {"sinks": 0, "scale": 0.0, "softcap": 0.0, "plugin_namespace": DOMAIN}


def _build_cached(b: _Body) -> str:
    """Shapes in comments: G = H / H_kv, N = ring rows read (<= W), NS = max(sinks, 1) sink rows read."""
    i0, i1 = b.const(0), b.const(1)
    sinks = b.attr_const("sinks", onnx.AttributeProto.INT)
    scale_attr = b.attr_const("scale", onnx.AttributeProto.FLOAT)
    cap = b.attr_const("softcap", onnx.AttributeProto.FLOAT)
    no_cap = b.Equal(cap, b.const(0.0, np.float32))
    cap_safe = b.Where(no_cap, b.const(1.0, np.float32), cap)
    qf, qsf, kf, vf = (b.Cast(x, to=TensorProto.FLOAT) for x in ("q", "q_sink", "k", "v"))
    pk, pv = b.Cast("past_key", to=TensorProto.FLOAT), b.Cast("past_value", to=TensorProto.FLOAT)
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
    kw = b.Gather(b.Reshape(pk, flat), rows, axis=0)  # [B, H_kv, N, D]
    vw = b.Gather(b.Reshape(pv, flat), rows, axis=0)
    # sink rows: at least one row is read even without sinks (then masked): zero-sized tensors break older ORT
    ns = b.Max(sinks, i1)
    ks = b.Slice(pk, b.const([0]), b.Unsqueeze(ns, b.const([0])), b.const([2]))  # [B, H_kv, NS, D]
    vs = b.Slice(pv, b.const([0]), b.Unsqueeze(ns, b.const([0])), b.const([2]))
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
    scores = []
    for (query, key, _), bias in zip(groups, biases):
        s = b.MatMul(query, b.Transpose(key, perm=[0, 1, 3, 2]))  # [B, H_kv, G*S, L]
        s = b.Where(no_cap, s, b.Mul(b.Tanh(b.Div(s, cap_safe)), cap_safe))  # soft-capping (0: none)
        scores.append(b.Add(b.Reshape(s, b.vec(bsz, hkv, g, sq, b.const(-1))), bias))  # [B, H_kv, G, S, L]
    m = scores[0]
    m = b.reduce("ReduceMax", scores[0], -1)
    for s in scores[1:]:
        m = b.Max(m, b.reduce("ReduceMax", s, -1))  # finite: every row reads its own key
    exps = [b.Exp(b.Sub(s, m)) for s in scores]
    denom = b.Add(b.Add(*(b.reduce("ReduceSum", e, -1) for e in exps[:2])), b.reduce("ReduceSum", exps[2], -1))
    num = None
    for e, (_, _, value) in zip(exps, groups):
        part = b.MatMul(b.Reshape(e, b.vec(bsz, hkv, b.Mul(g, sq), b.const(-1))), value)  # [B, H_kv, G*S, D]
        num = part if num is None else b.Add(num, part)
    o = b.Div(b.Reshape(num, b.vec(bsz, hkv, g, sq, d)), denom)  # [B, H_kv, G, S, D]
    o = b.Reshape(o, b.vec(bsz, h, sq, d))
    return b.CastLike(o, "q")


def cached_function_proto(opset: int = 18) -> onnx.FunctionProto:
    """The local function edgeattn::CachedWindowedAttention against the default-domain `opset` (>= 18)."""
    if opset < 18:
        raise ValueError(f"the cached op's body needs opset >= 18, found {opset}")
    b = _Body(opset)
    return make_function(b, _build_cached(b), CACHED_OP_TYPE, CACHED_INPUTS, CACHED_ATTRIBUTES)


def make_cached_node(inputs: list[str], *, out: str, sinks: int, scale: float = 0.0, softcap: float = 0.0,
                     name: str | None = None) -> onnx.NodeProto:
    if len(inputs) != len(CACHED_INPUTS):
        raise ValueError(f"expected inputs {CACHED_INPUTS}, found {len(inputs)}")
    extra = {"softcap": float(softcap)} if softcap else {}  # written only when set: other graphs stay as they were
    return helper.make_node(CACHED_OP_TYPE, inputs, [out], name=name, domain=DOMAIN, sinks=int(sinks),
                            scale=float(scale), plugin_namespace=DOMAIN, **extra)
