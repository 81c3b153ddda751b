"""Rewrite rules: ONNX Runtime's `com.microsoft` attention ops -> edgeattn::WindowedAttention.

Graphs rewritten by ONNX Runtime's transformers optimizer (`optimize_model`) hold `Attention` (packed
Q/K/V weights and bias, a `mask_index`) or `MultiHeadAttention` (separate Q/K/V, a `key_padding_mask`).
Where the semantics allow, the rules unpack Q/K/V in front of the windowed op (MatMul, Add, Split,
Reshape and Transpose into heads) and fold the heads back after it; the mask is understood by value like
every other mask (`allowed_from_index`, then fuse_attention_masks.meaning). What cannot be mapped (a KV
cache inside the op, rotary inside the op, an attention bias, GroupQueryAttention's fixed local window,
packed forms) is left alone, and `unsupported` says why. SkipLayerNormalization, FastGelu, BiasGelu and
EmbedLayerNormalization are not attention and stay: ONNX Runtime runs them.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from edgeattn.passes.fuse_attention_masks import PROBE_BATCH, PROBE_SEQ, MaskMeaning
from edgeattn.passes.fuse_attention_rules import _WindowedRule

MS = "com.microsoft"
FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
MAPPED = ("Attention", "MultiHeadAttention")
NOT_MAPPED = {  # op type -> why it stays (besides the per-node reasons of `unsupported`)
    "GroupQueryAttention": "it keeps its own KV cache (past_key/past_value, seqlens_k, total_sequence_length), "
                           "may rotate Q and K inside (do_rotary) and has a fixed local_window_size",
    "PackedAttention": "packed (padding-removed) tokens with a token offset input",
    "PackedMultiHeadAttention": "packed (padding-removed) tokens with a token offset input",
    "DecoderMaskedMultiHeadAttention": "a decoding step over ONNX Runtime's own shared-buffer KV cache",
    "DecoderMaskedSelfAttention": "a decoding step over ONNX Runtime's own shared-buffer KV cache",
    "DecoderAttention": "an encoder-decoder step with its own KV cache",
    "SparseAttention": "block-sparse attention with its own layout and KV cache",
    "LongformerAttention": "Longformer's sliding window plus global tokens",
    "QAttention": "quantized (int8) packed Q/K/V weights",
    "PagedAttention": "a paged KV cache",
}
MASK_INPUT = {"Attention": 3, "MultiHeadAttention": 4}  # mask_index / key_padding_mask
BIAS_INPUT = {"Attention": 2, "MultiHeadAttention": 3}  # the Q/K/V projection bias
ATTENTION_BIAS_INPUT = {"Attention": 5, "MultiHeadAttention": 5}
CACHE_INPUTS = {"Attention": (4, 6), "MultiHeadAttention": (6, 7, 8, 9)}  # past..., past_sequence_length


def is_contrib_attention(node: ir.Node) -> bool:
    return node.domain == MS and (node.op_type in MAPPED or node.op_type in NOT_MAPPED)


def _given(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if len(node.inputs) > index else None


def _rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def unsupported(node: ir.Node) -> str | None:
    """Why this com.microsoft attention node cannot become the windowed op, or None when it can."""
    name = f"com.microsoft {node.op_type}"
    if node.op_type in NOT_MAPPED:
        extra = ", ".join(f"{a}={node.attributes.get_int(a, 0)}" for a in ("do_rotary", "local_window_size")
                          if a in node.attributes)
        return f"{name} is not mapped: {NOT_MAPPED[node.op_type]}" + (f" ({extra})" if extra else "")
    cache = any(_given(node, i) is not None for i in CACHE_INPUTS[node.op_type])
    if cache or any(o.uses() for o in node.outputs[1:]):
        return f"{name} with a KV cache (past/present): the cache lives inside ONNX Runtime's op"
    if _given(node, ATTENTION_BIAS_INPUT[node.op_type]) is not None:
        return f"{name} with an attention_bias input (relative position bias or ALiBi): the windowed op has none"
    if node.attributes.get_int("do_rotary", 0):
        return f"{name} rotates Q and K inside (do_rotary=1): the windowed op expects rotated inputs"
    if node.op_type == "MultiHeadAttention" and (_given(node, 1) is None or _rank(node.inputs[1]) == 5):
        return f"{name} with packed QKV or KV: only separate Q, K, V are mapped"
    if node.op_type == "MultiHeadAttention" and _rank(node.inputs[1]) == 4 and _given(node, 3) is not None:
        return f"{name} with a bias and keys already in heads [B, N, L, H] (cross attention): not mapped"
    return None


def allowed_from_index(value: np.ndarray) -> np.ndarray | str:
    """[B, S_q, S_k] bool of attended keys from a mask_index / key_padding_mask value on the probe."""
    b, s = PROBE_BATCH, PROBE_SEQ
    keys = np.arange(s)
    if value.ndim == 1 and value.shape[0] in (b, 2 * b):  # end positions [B], or ends then starts [2B]
        end, start = value[:b], (value[b:] if value.shape[0] == 2 * b else np.zeros(b, value.dtype))
        allowed = (keys[None, :] < end[:, None]) & (keys[None, :] >= start[:, None])
        return np.broadcast_to(allowed[:, None, :], (b, s, s))
    if value.ndim in (2, 3) and value.shape[0] == b and value.shape[-1] == s:
        allowed = value.astype(bool)
        return np.broadcast_to(allowed[:, None, :] if value.ndim == 2 else allowed, (b, s, s))
    return f"mask_index of shape {list(value.shape)} on a {b}x{s} probe: expected [B], [2B], [B, S_k] or [B, S_q, S_k]"


def _head_dim(node: ir.Node, heads: int) -> int | None:
    """Q's head size from the packed weights [in, 3 * N * D], the bias [3 * N * D] or Q [B, S, N * D]."""
    bias = _given(node, BIAS_INPUT[node.op_type])
    if node.op_type == "Attention" and _rank(node.inputs[1]) == 2:
        packed = node.inputs[1].shape[-1]
    elif bias is not None and _rank(bias) == 1:
        packed = bias.shape[0]
    else:
        packed = node.inputs[0].shape[-1] * 3 if _rank(node.inputs[0]) == 3 else None
    if not isinstance(packed, int) or packed % (3 * heads):
        return None  # unknown or symbolic
    return packed // (3 * heads)


def _heads(op, x, num_heads: int):
    """[B, S, N*D] -> [B, N, S, D]."""
    shape = op.Constant(value=ir.tensor(np.array([0, 0, num_heads, -1], np.int64)))
    return op.Transpose(op.Reshape(x, shape), perm=[0, 2, 1, 3])


def _merge(op, y):
    """[B, N, S, D] -> [B, S, N*D]."""
    return op.Reshape(op.Transpose(y, perm=[0, 2, 1, 3]), op.Constant(value=ir.tensor(np.array([0, 0, -1], np.int64))))


class ContribAttention(_WindowedRule):
    """com.microsoft Attention (packed QKV weights) or MultiHeadAttention (separate Q, K, V) -> the windowed op."""

    def __init__(self, *args, op_type: str):
        super().__init__(*args)
        self.op_type = op_type

    def pattern(self, op, x, w):
        return getattr(op, self.op_type)(x, w, _domain=MS, _allow_other_inputs=True)

    def check(self, context, x, w, **_):
        node = context.root
        reason = unsupported(node) or self._sizes_reason(node)
        meaning = self._meaning(node)
        if reason or isinstance(meaning, str):
            return self._fail(context, reason or meaning)
        self._pending = (node, meaning)
        return pattern.MatchResult()

    def _sizes_reason(self, node: ir.Node) -> str | None:
        if not node.attributes.get_int("num_heads", 0):
            return f"com.microsoft {node.op_type} without num_heads"
        sizes = node.attributes.get_ints("qkv_hidden_sizes", None)
        if sizes is not None and not (len(sizes) == 3 and sizes[0] == sizes[1] == sizes[2]):
            return f"qkv_hidden_sizes {list(sizes)}: the windowed op needs equal Q, K and V widths"
        return None

    def _meaning(self, node: ir.Node) -> MaskMeaning | str:
        causal = bool(node.attributes.get_int("unidirectional", 0))
        mask = _given(node, MASK_INPUT[node.op_type])
        if mask is None:
            return MaskMeaning(causal, False)
        return self.masks.get(("index", mask.name, causal), "the mask was not probed")

    def rewrite(self, op, x, w, **_):
        node, meaning = self._pending  # set by check() for this match
        heads, scale = node.attributes.get_int("num_heads"), node.attributes.get_float("scale", 0.0)
        bias = _given(node, BIAS_INPUT[node.op_type])
        if node.op_type == "Attention":
            qkv = op.MatMul(x, w)
            qkv = op.Add(qkv, bias) if bias is not None else qkv
            q, k, v = op.Split(qkv, axis=-1, num_outputs=3, _outputs=3)
        else:
            q, k, v = x, w, node.inputs[2]
            if bias is not None:
                bq, bk, bv = op.Split(bias, axis=0, num_outputs=3, _outputs=3)
                q, k, v = op.Add(q, bq), op.Add(k, bk), op.Add(v, bv)
        q, k, v = (t if _rank(t) == 4 else _heads(op, t, heads) for t in (q, k, v))  # 3-D [B, S, N*D] or [B, N, S, D]
        self._annotate((q, k, v), node, heads)
        return _merge(op, self._emit(op, q, k, v, meaning, scale, node.op_type))

    @staticmethod
    def _annotate(values, node: ir.Node, heads: int) -> None:
        """ONNX has no shape inference for com.microsoft ops: give the heads the type and shape we know."""
        dtype = next((i.dtype for i in node.inputs if i is not None and i.dtype in FLOATS), None)
        if dtype is None:
            return
        for t in values:
            t.dtype = t.dtype or dtype
            t.shape = t.shape or ir.Shape([None, heads, None, _head_dim(node, heads)])


SHAPE_OF_FIRST_INPUT = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "FastGelu", "BiasGelu",
                        "Gelu", "QuickGelu", "RotaryEmbedding", "Attention", "MultiHeadAttention")


def annotate_shapes(graph: ir.Graph) -> int:
    """Give the first output of shape-preserving com.microsoft ops the type and rank of their first input.

    ONNX's shape inference knows no com.microsoft op, so everything after the first SkipLayerNormalization
    of an optimized graph would have no rank and no rule could check its operands. (Attention outputs keep
    the rank, not the width: the last dim is left unknown.) Returns how many values were annotated."""
    count = 0
    for node in graph:
        out, first = node.outputs[0], (node.inputs[0] if node.inputs else None)
        if node.domain != MS or node.op_type not in SHAPE_OF_FIRST_INPUT or first is None or out.shape is not None:
            continue
        if first.shape is None or first.dtype is None:
            continue
        dims = list(first.shape)
        if node.op_type in ("Attention", "MultiHeadAttention"):
            if len(dims) != 3:
                continue  # a packed query: the output's rank is not the input's
            dims[-1] = None
        out.dtype, out.shape = first.dtype, ir.Shape(dims)
        count += 1
    return count


def rules(window, padding, masks: dict, failures: dict) -> list[ContribAttention]:
    return [ContribAttention(f"contrib-{t}", window, padding, masks, failures, op_type=t) for t in MAPPED]


def mask_inputs(graph: ir.Graph) -> list[tuple[str, bool]]:
    """(mask value name, unidirectional) of each mappable com.microsoft attention node, for the probe."""
    found = []
    for node in graph:
        if node.domain == MS and node.op_type in MASK_INPUT and (m := _given(node, MASK_INPUT[node.op_type])):
            found.append((m.name, bool(node.attributes.get_int("unidirectional", 0))))
    return found
