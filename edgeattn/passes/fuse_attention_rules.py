"""Rewrite rules: softmax(Q K^T * scale + mask) V, and the opset-23 Attention op -> edgeattn::WindowedAttention.

Each rule's `check` says why it did not fire (recorded per attention block by the pass). Masks are
understood by value (fuse_attention_masks), handed in as `masks`: value name -> MaskMeaning or reason.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from edgeattn.attention import DOMAIN, OP_TYPE, OPSET_VERSION
from edgeattn.attention.onnx_node import PLUGIN_NAMESPACE
from edgeattn.passes.fuse_attention_masks import MaskMeaning


class _WindowedRule(pattern.RewriteRuleClassBase):
    """Shared state: the window input, the padding input, mask meanings, and recorded failures."""

    def __init__(self, name: str, window: ir.Value, padding: ir.Value | None, masks: dict, failures: dict):
        super().__init__(name)
        self.window, self.padding, self.masks, self.failures = window, padding, masks, failures
        self.fused: list[str] = []

    def _fail(self, context, reason: str, *, weak: bool = False):
        """weak: a reason that only counts when no other binding of the block gave one (commuted operands)."""
        root = getattr(context, "root", None)
        if root is not None and not (weak and root.outputs[0].name in self.failures):
            self.failures[root.outputs[0].name] = reason  # keyed by the block's output value
        return pattern.MatchResult().fail(reason)

    def _emit(self, op, q, k, v, meaning: MaskMeaning, scale: float, root_name: str):
        pad = self.padding if meaning.padded else None
        if pad is None:  # the body always reads a mask: all keys real
            b_sk = op.Gather(op.Shape(k), op.Constant(value=ir.tensor(np.array([0, 2], np.int64))))
            pad = op.ConstantOfShape(b_sk, value=ir.tensor(np.array([True])))
        self.fused.append(root_name)
        return getattr(op, OP_TYPE)(q, k, v, self.window, pad, _domain=DOMAIN, _version=OPSET_VERSION,
                                    causal=int(meaning.causal), sinks=0, scale=float(scale),
                                    plugin_namespace=PLUGIN_NAMESPACE)


def _rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def _scalar(value: ir.Value | None) -> float | None:
    tensor = ir.convenience.get_const_tensor(value) if value is not None else None
    if tensor is None:
        return None
    array = tensor.numpy()
    return float(array.reshape(-1)[0]) if array.size == 1 else None


def _producer(value: ir.Value, op_type: str) -> ir.Node | None:
    node = value.producer()
    return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None


def _unrepeated(value: ir.Value) -> ir.Value | None:
    """k before repeat_kv (Unsqueeze(axis 2) -> Expand -> Reshape), for grouped-query attention."""
    reshape = _producer(value, "Reshape")
    expand = _producer(reshape.inputs[0], "Expand") if reshape else None
    unsq = _producer(expand.inputs[0], "Unsqueeze") if expand else None
    if unsq is None or len(unsq.inputs) < 2:
        return None
    axes = ir.convenience.get_const_tensor(unsq.inputs[1])
    ok = axes is not None and axes.numpy().reshape(-1).tolist() == [2] and _rank(unsq.inputs[0]) == 4
    return unsq.inputs[0] if ok else None


def _keys(op, kt: ir.Value):
    """k [B, H, S, D] from K^T [B, H, D, S]: undo the exporter's transpose instead of adding one."""
    node = _producer(kt, "Transpose")
    perm = list(node.attributes["perm"].as_ints()) if node is not None and "perm" in node.attributes else None
    if perm is None:
        return op.Transpose(kt, perm=[0, 1, 3, 2]), None
    inner = [perm[0], perm[1], perm[3], perm[2]]
    if inner == [0, 1, 2, 3]:
        return node.inputs[0], node.inputs[0]
    return op.Transpose(node.inputs[0], perm=inner), None


class SoftmaxAttention(_WindowedRule):
    """MatMul(Softmax(MatMul(Q, K^T) [*|/ scale] [+ mask | Where(mask, ., -inf)]), V), up to two Casts.

    TorchScript's scaled_dot_product_attention (opsets 14-17) scales Q and K^T by sqrt(scale) each before
    the MatMul and zeroes NaN rows after the softmax: Where(IsNaN(w), 0, w); both are taken too.
    """

    def pattern(self, op, q, kt, v, qk_scale, q_scale, k_scale, mask, fill, nan_fill):
        scores = pattern.OrValue([op.MatMul(op.Mul(q, q_scale), op.Mul(kt, k_scale)), op.MatMul(q, kt)],
                                 tag_var="prescaled", tag_values=[True, False])
        scores = pattern.OrValue([op.Mul(scores, qk_scale), op.Div(scores, qk_scale), scores],
                                 tag_var="scaling", tag_values=["Mul", "Div", "None"])
        scores = pattern.OrValue([op.Add(scores, mask), op.Where(mask, scores, fill), scores],
                                 tag_var="masking", tag_values=["add", "keep", "none"])
        weights = op.Softmax(scores, axis=-1)
        nan_guarded = op.Where(op.IsNaN(weights), nan_fill, weights)
        weights = pattern.OrValue([op.Cast(op.Cast(weights)), op.Cast(weights), nan_guarded, weights],
                                  tag_var="casts", tag_values=[2, 1, "nan", 0])  # TorchScript casts twice
        return op.MatMul(weights, v)

    def check(self, context, q, kt, v, qk_scale=None, q_scale=None, k_scale=None, mask=None, fill=None,
              nan_fill=None, scaling="None", masking="none", prescaled=False, casts=0, **_):
        if prescaled and not (_scalar(q_scale) and _scalar(k_scale)):  # weak: Mul(q, s) is also tried as Mul(s, q)
            return self._fail(context, "Q or K^T is scaled by something other than a non-zero constant", weak=True)
        if (_rank(q), _rank(kt), _rank(v)) != (4, 4, 4):
            return self._fail(context, f"Q, K^T, V ranks {(_rank(q), _rank(kt), _rank(v))}: expected 4-D [B, H, S, D] tensors")
        if scaling != "None" and not _scalar(qk_scale):
            return self._fail(context, "the score scale is not a non-zero constant")
        if casts == "nan" and _scalar(nan_fill) != 0.0:
            return self._fail(context, "Where(IsNaN(softmax), fill, softmax) with a fill that is not 0")
        if masking == "keep" and not ((_scalar(fill) or 0.0) <= -1e4):
            return self._fail(context, "Where(mask, scores, fill) with a fill that is not -inf")
        meaning = MaskMeaning(False, False) if masking == "none" else self.masks.get(mask.name, "the mask was not probed")
        if isinstance(meaning, str):
            return self._fail(context, meaning)
        return pattern.MatchResult()

    def rewrite(self, op, q, kt, v, qk_scale=None, q_scale=None, k_scale=None, mask=None, scaling="None",
                masking="none", prescaled=False, **_):
        scale = {"None": 1.0, "Mul": _scalar(qk_scale), "Div": 1.0 / (_scalar(qk_scale) or 1.0)}[scaling]
        if prescaled:
            scale *= _scalar(q_scale) * _scalar(k_scale)
        meaning = MaskMeaning(False, False) if masking == "none" else self.masks[mask.name]
        k, k_plain = _keys(op, kt)
        k0, v0 = (_unrepeated(k_plain), _unrepeated(v)) if k_plain is not None else (None, None)
        if k0 is not None and v0 is not None:  # grouped-query attention: read the H_kv heads directly
            k, v = k0, v0
        return self._emit(op, q, k, v, meaning, scale, "softmax-attention")


class StandardAttention(_WindowedRule):
    """The opset-23 Attention op with 4-D inputs, an optional boolean or additive mask, no softcap."""

    def __init__(self, *args, with_mask: bool):
        super().__init__(*args)
        self.with_mask = with_mask

    def pattern(self, op, q, k, v, mask):
        return op.Attention(q, k, v, mask) if self.with_mask else op.Attention(q, k, v)

    def check(self, context, q, k, v, mask=None, **_):
        node = context.root
        if (_rank(q), _rank(k), _rank(v)) != (4, 4, 4):
            return self._fail(context, f"Attention with ranks {(_rank(q), _rank(k), _rank(v))}: only the 4-D [B, H, S, D] form is fused")
        if node.attributes.get_float("softcap", 0.0) or node.attributes.get_int("qk_matmul_output_mode", 0):
            return self._fail(context, "Attention with softcap or a qk_matmul output mode")
        if any(o.uses() for o in node.outputs[1:]) or len(node.inputs) > 4:
            return self._fail(context, "Attention with a KV cache (past/present inputs or outputs)")
        meaning = self._meaning(node, mask)
        if isinstance(meaning, str):
            return self._fail(context, meaning)
        self._pending = (meaning, node.attributes.get_float("scale", 0.0))  # 0 = 1/sqrt(D), as in the op
        return pattern.MatchResult()

    def _meaning(self, node, mask) -> MaskMeaning | str:
        is_causal = bool(node.attributes.get_int("is_causal", 0))
        if mask is None:
            return MaskMeaning(is_causal, False)
        return self.masks.get((mask.name, is_causal), "the mask was not probed")

    def rewrite(self, op, q, k, v, mask=None, **_):
        meaning, scale = self._pending  # set by check() for this match
        return self._emit(op, q, k, v, meaning, scale, "Attention")
