"""The portable body of edgeattn::WindowedAttention: an ONNX local function built from standard ops.

Block-local, so its cost follows the window: queries are cut into blocks of BLOCK_Q rows; each query
block reads a run of `nr` consecutive key blocks (BLOCK_K keys each) that holds every key its window can
reach, plus the sink block(s). The run's block indices are computed from `window` at run time (Range,
Add, Gather), scores are computed only on those keys, masked by exact positions (docs/windowed-attention.md),
and softmax-ed together with the sink keys. `window` 0 or >= S_k gives a run over every key block: exact
full attention.

`body="dense"` gives a second, equivalent body for short sequences: one [S_q, S_k] mask from positions,
one score GEMM, Softmax, one GEMM. Its work is S_q x S_k whatever the window, but it has a tenth of the
nodes, which is what counts on a CPU at a few hundred tokens (`edgeattn build` picks it for the cpu target
when the sequence range ends at or below DENSE_MAX_SEQ; see passes/attention_body.py).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeattn.attention import DOMAIN, OP_TYPE

BLOCK_Q = 64  # query rows per block (64/64 measured fastest on CPU at S=4096)
BLOCK_K = 64  # keys per block; the run of key blocks is ceil((window + BLOCK_Q - 1) / BLOCK_K) + 1 long
INPUTS = ("q", "k", "v", "window", "key_padding_mask")
BODIES = ("blocked", "dense")
DENSE_MAX_SEQ = 512  # the cpu target uses the dense body up to this many keys
ATTRIBUTES = {"causal": 1, "sinks": 0, "scale": 0.0, "plugin_namespace": DOMAIN}


class _Body:
    """A tiny emitter: each call appends one node and returns its output name."""

    def __init__(self, opset: int):
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self._n = 0

    def __getattr__(self, op_type: str):
        def emit(*inputs: str, **attrs) -> str:
            self._n += 1
            out = f"_{op_type.lower()}{self._n}"
            self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
            return out

        return emit

    def Reshape(self, x: str, shape: str, check: str | None = None) -> str:  # noqa: N802 - a 0 in our shapes is a real 0
        """`check` names the node, so ONNX Runtime's error says which input rule was broken."""
        extra = {"name": f"{DOMAIN}.{OP_TYPE}: {check}"} if check else {}
        return self.__getattr__("Reshape")(x, shape, allowzero=1, **extra)

    def const(self, value, dtype=np.int64) -> str:
        return self.Constant(value=numpy_helper.from_array(np.array(value, dtype=dtype)))

    def attr_const(self, attr: str, kind: int) -> str:
        key = {onnx.AttributeProto.INT: "value_int", onnx.AttributeProto.FLOAT: "value_float"}[kind]
        self._n += 1
        out = f"_{attr}{self._n}"
        node = helper.make_node("Constant", [], [out])
        node.attribute.append(helper.make_attribute_ref(key, kind, ref_attr_name=attr))
        self.nodes.append(node)
        return out

    def dim(self, shape: str, i: int) -> str:  # one dim of a Shape result, as an int64 scalar
        return self.Squeeze(self.Slice(shape, self.const([i]), self.const([i + 1])), self.const([0]))

    def vec(self, *scalars: str) -> str:  # int64 scalars -> 1-D shape tensor
        return self.Concat(*(self.Unsqueeze(s, self.const([0])) for s in scalars), axis=0)

    def reduce(self, op: str, x: str, axis: int) -> str:  # keepdims; axes moved to an input at 18 (13 for Sum)
        if op == "ReduceSum" or self.opset >= 18:
            return getattr(self, op)(x, self.const([axis]), keepdims=1)
        return getattr(self, op)(x, axes=[axis], keepdims=1)


def _build(b: _Body) -> str:
    """Emit the body; returns the output name. Shapes in comments: G = H / H_kv, L = keys read."""
    i0, i1, i2 = b.const(0), b.const(1), b.const(2)
    bq, bk = b.const(BLOCK_Q), b.const(BLOCK_K)
    causal = b.Cast(b.attr_const("causal", onnx.AttributeProto.INT), to=TensorProto.INT64)
    sinks = b.attr_const("sinks", onnx.AttributeProto.INT)
    scale_attr = b.attr_const("scale", onnx.AttributeProto.FLOAT)
    qf, kf = (b.Cast(x, to=TensorProto.FLOAT) for x in ("q", "k"))
    vf = b.Reshape(b.Cast("v", to=TensorProto.FLOAT), b.Shape("k"), check="expected v of k's shape [B, H_kv, S_k, D]")
    sq_shape, sk_shape = b.Shape("q"), b.Shape("k")
    bsz, h, sq, d = (b.dim(sq_shape, i) for i in range(4))
    hkv, sk = b.dim(sk_shape, 1), b.dim(sk_shape, 2)
    g = b.Div(h, hkv)
    # window: <= 0 (0 = full; negative is treated like 0) or >= S_k means every key
    w = b.Reshape("window", b.const([], np.int64))
    full = b.Or(b.LessOrEqual(w, i0), b.GreaterOrEqual(w, sk))
    w = b.Where(full, sk, w)
    d_f = b.Cast(d, to=TensorProto.FLOAT)
    scale = b.Where(b.Equal(scale_attr, b.const(0.0, np.float32)), b.Reciprocal(b.Sqrt(d_f)), scale_attr)
    nqb = b.Div(b.Add(sq, b.Sub(bq, i1)), bq)
    nkb = b.Div(b.Add(sk, b.Sub(bk, i1)), bk)
    offset = b.Sub(sk, sq)  # query row i sits at absolute position i + offset
    # pad the sequence axes to whole blocks, then split them into blocks
    q_pad = b.Pad(qf, b.vec(i0, i0, i0, i0, i0, i0, b.Sub(b.Mul(nqb, bq), sq), i0))
    kv_pads = b.vec(i0, i0, i0, i0, i0, i0, b.Sub(b.Mul(nkb, bk), sk), i0)
    gbq = b.Mul(g, bq)  # the G query heads sharing a KV head are stacked: one GEMM per (KV head, block)
    qb = b.Transpose(b.Reshape(q_pad, b.vec(bsz, hkv, g, nqb, bq, d),
                             check="expected q [B, H, S_q, D] with H a multiple of k's H_kv"), perm=[0, 1, 3, 2, 4, 5])
    qb = b.Reshape(qb, b.vec(bsz, hkv, nqb, gbq, d))  # [B, H_kv, NQB, G*BQ, D]
    kb = b.Reshape(b.Pad(kf, kv_pads), b.vec(bsz, hkv, nkb, bk, d), check="expected k [B, H_kv, S_k, D] with q's B and D")  # [B, H_kv, NKB, BK, D]
    vb = b.Reshape(b.Pad(vf, kv_pads), b.vec(bsz, hkv, nkb, bk, d))
    # the run of key blocks each query block reads: nr blocks starting at `start`
    span = b.Add(b.Mul(b.Sub(i2, causal), w), b.Add(b.Sub(bq, i2), causal))  # keys a query block can reach
    nr = b.Min(b.Add(b.Div(b.Add(span, b.Sub(bk, i1)), bk), i1), nkb)
    qstart = b.Add(b.Mul(b.Range(i0, nqb, i1), bq), offset)  # [NQB] position of each block's first query
    first = b.Div(b.Max(b.Add(b.Sub(qstart, w), i1), i0), bk)
    start = b.Min(first, b.Sub(nkb, nr))  # slide the run inside [0, NKB): distinct, in-range blocks
    blocks = b.Add(b.Unsqueeze(start, b.const([1])), b.Unsqueeze(b.Range(i0, nr, i1), b.const([0])))  # [NQB, NR]
    lw = b.Mul(nr, bk)
    kw = b.Reshape(b.Gather(kb, blocks, axis=2), b.vec(bsz, hkv, nqb, lw, d))  # [B, H_kv, NQB, Lw, D]
    vw = b.Reshape(b.Gather(vb, blocks, axis=2), b.vec(bsz, hkv, nqb, lw, d))
    arange_bk = b.Range(i0, bk, i1)
    kpos_w = b.Reshape(b.Add(b.Unsqueeze(b.Mul(blocks, bk), b.const([2])), arange_bk),
                       b.vec(nqb, i1, lw))  # [NQB, 1, Lw]
    # sink blocks: the first ceil(sinks / BK) blocks, read by every query block
    # at least one block even when sinks == 0 (then fully masked): zero-sized tensors break older ORT
    nsb = b.Min(b.Max(b.Div(b.Add(sinks, b.Sub(bk, i1)), bk), i1), nkb)
    ls = b.Mul(nsb, bk)
    ks = b.Reshape(b.Slice(kb, b.const([0]), b.Unsqueeze(nsb, b.const([0])), b.const([2])),
                   b.vec(bsz, hkv, i1, ls, d))  # [B, H_kv, 1, Ls, D]
    vs = b.Reshape(b.Slice(vb, b.const([0]), b.Unsqueeze(nsb, b.const([0])), b.const([2])),
                   b.vec(bsz, hkv, i1, ls, d))
    kpos_s = b.Reshape(b.Range(i0, ls, i1), b.vec(i1, i1, ls))  # [1, 1, Ls]
    qpos = b.Reshape(b.Add(b.Range(i0, b.Mul(nqb, bq), i1), offset), b.vec(nqb, bq, i1))  # [NQB, BQ, 1]
    # exact masks by position (padding added below)
    not_causal = b.Equal(causal, i0)
    ok_w = b.And(b.Less(kpos_w, sk), b.Or(not_causal, b.LessOrEqual(kpos_w, qpos)))
    in_band = b.Or(b.Less(b.Abs(b.Sub(qpos, kpos_w)), w), b.Less(kpos_w, sinks))
    ok_w = b.And(ok_w, in_band)  # [NQB, BQ, Lw]
    run_start = b.Reshape(b.Mul(start, bk), b.vec(nqb, i1, i1))  # sinks already inside the run count once
    ok_s = b.And(b.And(b.Less(kpos_s, sinks), b.Less(kpos_s, sk)), b.Less(kpos_s, run_start))
    ok_s = b.And(ok_s, b.Or(not_causal, b.LessOrEqual(kpos_s, qpos)))  # [NQB, BQ, Ls]
    ok_w, ok_s = (b.Unsqueeze(x, b.const([1])) for x in (ok_w, ok_s))  # [NQB, 1, BQ, L]: broadcast over G
    ok_w, ok_s = _with_padding(b, ok_w, ok_s, blocks, nsb, nkb, bsz, sk, nqb, lw, ls)
    # scores, softmax over window and sink keys together, weighted sum. Masks become additive 0/-inf biases
    # on their small [B, 1, 1, NQB, BQ, L] shape (a broadcast Add is much cheaper than a broadcast Where).
    zero, neg_inf = b.const(0.0, np.float32), b.const(-np.inf, np.float32)
    bias_w, bias_s = b.Where(ok_w, zero, neg_inf), b.Where(ok_s, zero, neg_inf)
    qs = b.Mul(qb, scale)  # scale the queries: S_q x D products instead of S_q x L
    s_w = b.Reshape(b.MatMul(qs, b.Transpose(kw, perm=[0, 1, 2, 4, 3])), b.vec(bsz, hkv, nqb, g, bq, lw))
    s_s = b.Reshape(b.MatMul(qs, b.Transpose(ks, perm=[0, 1, 2, 4, 3])), b.vec(bsz, hkv, nqb, g, bq, ls))
    s_w, s_s = b.Add(s_w, bias_w), b.Add(s_s, bias_s)  # [B, H_kv, NQB, G, BQ, Lw] and [..., Ls]
    m = b.Max(b.reduce("ReduceMax", s_w, -1), b.reduce("ReduceMax", s_s, -1))
    m = b.Where(b.IsInf(m), b.const(0.0, np.float32), m)  # rows with no key: exp(-inf) = 0 below
    e_w, e_s = b.Exp(b.Sub(s_w, m)), b.Exp(b.Sub(s_s, m))
    denom = b.Add(b.reduce("ReduceSum", e_w, -1), b.reduce("ReduceSum", e_s, -1))
    e_w, e_s = b.Reshape(e_w, b.vec(bsz, hkv, nqb, gbq, lw)), b.Reshape(e_s, b.vec(bsz, hkv, nqb, gbq, ls))
    num = b.Add(b.MatMul(e_w, vw), b.MatMul(e_s, vs))  # [B, H_kv, NQB, G*BQ, D]
    num = b.Reshape(num, b.vec(bsz, hkv, nqb, g, bq, d))
    o = b.Div(num, b.Max(denom, b.const(1e-30, np.float32)))  # empty rows: 0 / tiny = 0
    o = b.Transpose(o, perm=[0, 1, 3, 2, 4, 5])  # [B, H_kv, G, NQB, BQ, D]
    o = b.Reshape(o, b.vec(bsz, h, b.Mul(nqb, bq), d))
    o = b.Slice(o, b.const([0]), b.Unsqueeze(sq, b.const([0])), b.const([2]))
    return b.CastLike(o, "q") if b.opset >= 15 else b.Cast(o, to=TensorProto.FLOAT)


def _build_dense(b: _Body) -> str:
    """The dense body: masked scores over every key. G = H / H_kv query heads share a KV head.

    The [S_k, S_k] mask is computed from the key padding mask, the window and the attributes alone, so
    once ONNX Runtime inlines the op into every layer the copies are identical and its common-subexpression
    pass keeps one; each layer only slices its last S_q rows."""
    i0, i1 = b.const(0), b.const(1)
    causal = b.Cast(b.attr_const("causal", onnx.AttributeProto.INT), to=TensorProto.INT64)
    sinks = b.attr_const("sinks", onnx.AttributeProto.INT)
    scale_attr = b.attr_const("scale", onnx.AttributeProto.FLOAT)
    # shared part: [B, 1, 1, S_k, S_k] additive mask and [B, 1, 1, S_k, 1] "row has a key"
    pm = b.Cast("key_padding_mask", to=TensorProto.BOOL)  # [B, S_k]
    pm_shape = b.Shape(pm)
    bsz, sk = b.dim(pm_shape, 0), b.dim(pm_shape, 1)
    w = b.Reshape("window", b.const([], np.int64))
    w = b.Where(b.Or(b.LessOrEqual(w, i0), b.GreaterOrEqual(w, sk)), sk, w)  # 0 / negative / >= S_k: full
    pos = b.Range(i0, sk, i1)
    qpos, kpos = b.Unsqueeze(pos, b.const([1])), b.Unsqueeze(pos, b.const([0]))  # [S_k, 1], [1, S_k]
    ok = b.Or(b.Equal(causal, i0), b.LessOrEqual(kpos, qpos))
    ok = b.And(ok, b.Or(b.Less(b.Abs(b.Sub(qpos, kpos)), w), b.Less(kpos, sinks)))  # [S_k, S_k]
    ok = b.And(ok, b.Reshape(pm, b.vec(bsz, i1, i1, i1, sk)))  # [B, 1, 1, S_k, S_k]
    # a finite -1e30 keeps Softmax NaN-free; rows with no key at all are zeroed after (any_ok)
    bias = b.Where(ok, b.const(0.0, np.float32), b.const(-1e30, np.float32))
    any_ok = b.reduce("ReduceMax", b.Cast(ok, to=TensorProto.FLOAT), -1)  # [B, 1, 1, S_k, 1]
    # per layer: queries are the last S_q positions
    qf, kf = (b.Cast(x, to=TensorProto.FLOAT) for x in ("q", "k"))
    vf = b.Reshape(b.Cast("v", to=TensorProto.FLOAT), b.Shape("k"), check="expected v of k's shape [B, H_kv, S_k, D]")
    sq_shape = b.Shape("q")
    h, sq, d = (b.dim(sq_shape, i) for i in (1, 2, 3))
    hkv = b.dim(b.Shape("k"), 1)
    g = b.Div(h, hkv)
    d_f = b.Cast(d, to=TensorProto.FLOAT)
    scale = b.Where(b.Equal(scale_attr, b.const(0.0, np.float32)), b.Reciprocal(b.Sqrt(d_f)), scale_attr)
    rows = (b.Unsqueeze(b.Sub(sk, sq), b.const([0])), b.Unsqueeze(sk, b.const([0])), b.const([3]))
    bias, any_ok = b.Slice(bias, *rows), b.Slice(any_ok, *rows)  # [B, 1, 1, S_q, S_k], [B, 1, 1, S_q, 1]
    qg = b.Reshape(qf, b.vec(bsz, hkv, g, sq, d), check="expected q [B, H, S_q, D] with H a multiple of k's H_kv")
    kg = b.Reshape(kf, b.vec(bsz, hkv, i1, sk, d),
                   check="expected k [B, H_kv, S_k, D] with q's B and D and the padding mask's S_k")
    vg = b.Reshape(vf, b.vec(bsz, hkv, i1, sk, d))
    scores = b.Add(b.MatMul(b.Mul(qg, scale), b.Transpose(kg, perm=[0, 1, 2, 4, 3])), bias)  # [B, H_kv, G, S_q, S_k]
    o = b.Mul(b.MatMul(b.Softmax(scores, axis=-1), vg), any_ok)  # [B, H_kv, G, S_q, D]
    o = b.Reshape(o, b.vec(bsz, h, sq, d))
    return b.CastLike(o, "q") if b.opset >= 15 else b.Cast(o, to=TensorProto.FLOAT)


def _with_padding(b: _Body, ok_w, ok_s, blocks, nsb, nkb, bsz, sk, nqb, lw, ls):
    """AND the key padding mask [B, S_k] into both masks (block-gathered like the keys)."""
    i0, i1, bk = b.const(0), b.const(1), b.const(BLOCK_K)
    pm = b.Cast(b.Cast("key_padding_mask", to=TensorProto.BOOL), to=TensorProto.INT64)
    pm = b.Pad(pm, b.vec(i0, i0, i0, b.Sub(b.Mul(nkb, bk), sk)))
    pm = b.Cast(b.Reshape(pm, b.vec(bsz, nkb, bk)), to=TensorProto.BOOL)  # [B, NKB, BK]
    pw = b.Reshape(b.Gather(pm, blocks, axis=1), b.vec(bsz, i1, nqb, i1, i1, lw))  # [B, 1, NQB, 1, 1, Lw]
    ps = b.Reshape(b.Slice(pm, b.const([0]), b.Unsqueeze(nsb, b.const([0])), b.const([1])),
                   b.vec(bsz, i1, i1, i1, i1, ls))  # [B, 1, 1, 1, 1, Ls]
    return b.And(ok_w, pw), b.And(ok_s, ps)


def function_proto(opset: int = 18, body: str = "blocked") -> onnx.FunctionProto:
    """The local function edgeattn::WindowedAttention, written against the default-domain `opset`.
    body: "blocked" (work follows the window) or "dense" (fewest nodes; for short sequences)."""
    if body not in BODIES:
        raise ValueError(f"body: expected one of {BODIES}, found {body!r}")
    b = _Body(opset)
    return make_function(b, _build(b) if body == "blocked" else _build_dense(b), OP_TYPE, INPUTS, ATTRIBUTES)


def make_function(b: _Body, out: str, op_type: str, inputs: tuple[str, ...], attributes: dict) -> onnx.FunctionProto:
    """The local function edgeattn::`op_type` from an emitted body whose result is `out`; attributes with defaults."""
    b.nodes.append(helper.make_node("Identity", [out], ["out"]))
    fn = helper.make_function(DOMAIN, op_type, list(inputs), ["out"], b.nodes, [helper.make_opsetid("", b.opset)],
                              attributes=[])
    for name, default in attributes.items():
        fn.attribute_proto.append(helper.make_attribute(name, default))
    return fn
