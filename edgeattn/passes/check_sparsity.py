"""Which constant weights of MatMul, Gemm and Conv hold 2:4 sparsity along their reduction axis.

Sparse tensor cores need two zeros in every four consecutive weights along K: MatMul B axis -2, Gemm B
axis 0 (1 with transB), Conv W axis 1 (input channels). The weight may sit behind DequantizeLinear (the
quantized value must equal its zero point), Transpose, Cast or Identity. The pass changes nothing: it
reports per layer sparse / dense / broken / skipped with the reason, and on targets with sparse tensor
cores records `enable_sparse_weights` for the engine builder. A weight is "broken" when it was meant to be
2:4 (named in the model's `edgeattn.sparse_layers` metadata, or already 2:4 in most groups) but some
group of four is not: that is a problem, never silent.

Attention fusion for ONNX Runtime packs a layer's q/k/v projections into one weight of its Attention /
QAttention kernel, under a new name. `edgeattn sparsify` records a digest of each pruned weight
(`edgeattn.sparse_weights`), so the check finds those layers inside the packed weight and reports them
under the fused kernel's name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx_ir as ir

from edgeattn.passes import PassContext, PassResult

METADATA_KEY = "edgeattn.sparse_layers"  # JSON list of layer names `edgeattn sparsify` pruned
DECISIONS_KEY = "edgeattn.sparsity_decisions"  # JSON {layer: {pruned, basis, reason}} from `edgeattn sparsify`
WEIGHTS_KEY = "edgeattn.sparse_weights"  # JSON {layer: digest of its weight as [K, N]} from `edgeattn sparsify`
FUSED = ("Attention", "QAttention")  # ONNX Runtime kernels whose input 1 packs q/k/v: [K, 3N], K on axis 0
MOSTLY_SPARSE = 0.5  # share of 2:4 groups above which a weight that is not all 2:4 counts as broken
PASS_THROUGH = ("Transpose", "Cast", "Identity", "DequantizeLinear")


@dataclass
class LayerSparsity:
    layer: str  # torch module path when the exporter recorded it, else the weight's name
    node: str
    op: str
    weight: str
    shape: list[int]
    axis: int  # reduction axis of the weight as stored
    status: str  # sparse | dense | broken | skipped
    reason: str
    groups_ok: float | None = None  # share of groups of 4 with >= 2 zeros
    covers: list[str] = field(default_factory=list)  # pruned layers packed into this weight by attention fusion

    @property
    def sparse(self) -> bool:
        return self.status == "sparse"


def _reduction_axis(node: ir.Node) -> tuple[int, int] | None:
    """(input index of the weight, its reduction axis) for MatMul, Gemm, Conv."""
    if node.op_type == "MatMul":
        return 1, -2
    if node.op_type == "Gemm":
        trans_b = node.attributes.get_int("transB", 0)
        return 1, (1 if trans_b else 0)
    if node.op_type == "Conv":
        return 1, 1
    if node.op_type in FUSED and node.domain == "com.microsoft":
        return 1, 0
    return None


def _constant(value: ir.Value | None, axis: int) -> tuple[np.ndarray, int, str, str] | str:
    """(zero-tested array, axis in it, weight name, path) of a constant, or why it is not one."""
    path = []
    zero_point = None
    while value is not None:
        if value.const_value is not None:
            array = value.const_value.numpy()
            if zero_point is not None:
                zp, zp_axis = zero_point
                shape = [1] * array.ndim
                if zp.size > 1:
                    shape[zp_axis % array.ndim] = zp.size
                array = array.astype(np.int64) - zp.reshape(shape if zp.size > 1 else ())
            return array, axis, value.name or "?", " <- ".join(path)
        node = value.producer()
        if node is None:
            return f"{value.name} is a graph input, not a constant"
        if node.op_type == "Constant":
            array = node.attributes["value"].as_tensor().numpy()
            return array, axis, node.outputs[0].name or node.name or "?", " <- ".join(path)
        if node.op_type not in PASS_THROUGH:
            return f"{value.name} is computed by {node.op_type} (an activation, not a constant weight)"
        path.append(node.op_type)
        if node.op_type == "Transpose":
            perm = node.attributes.get_ints("perm", None)
            rank = len(value.shape) if value.shape is not None else None
            if perm is None and rank is None:
                return f"Transpose before {value.name} has no perm and no known rank"
            perm = list(perm) if perm is not None else list(range(rank))[::-1]
            axis = perm[axis % len(perm)]
        if node.op_type == "DequantizeLinear":
            zp = node.inputs[2] if len(node.inputs) > 2 else None
            if zp is not None and zp.const_value is None:
                return f"DequantizeLinear zero point of {value.name} is not a constant"
            zp_array = zp.const_value.numpy().astype(np.int64) if zp is not None else np.zeros(1, np.int64)
            if zp_array.any():  # a zero weight is stored as its zero point
                zero_point = (zp_array, node.attributes.get_int("axis", 1))
        value = node.inputs[0]
    return "no input"


def _layer_name(node: ir.Node, weight: str) -> str:
    scopes = node.metadata_props.get("pkg.torch.onnx.name_scopes")
    if scopes:
        try:
            names = [s for s in json.loads(scopes.replace("'", '"')) if s]
        except json.JSONDecodeError:
            names = []
        if len(names) >= 2:
            name = names[-2]
            return name[len("inner."):] if name.startswith("inner.") else name
    return weight


def groups_ok(array: np.ndarray, axis: int) -> float:
    """Share of groups of 4 consecutive entries along `axis` holding >= 2 zeros (len % 4 == 0)."""
    moved = np.moveaxis(array, axis, -1)
    groups = moved.reshape(-1, moved.shape[-1] // 4, 4)
    return float(((groups == 0).sum(-1) >= 2).mean())


def weight_digest(array: np.ndarray, axis: int) -> str:
    """A digest of a weight's values laid out [K, N] (K: its reduction axis), however it is stored."""
    a = np.moveaxis(np.asarray(array), axis, 0)
    a = np.ascontiguousarray(a.reshape(a.shape[0], -1).astype(np.float64))
    return hashlib.sha256(repr(a.shape).encode() + a.tobytes()).hexdigest()[:20]


def _packed(array: np.ndarray, axis: int, digests: dict[str, str]) -> list[str]:
    """The recorded layers whose weights are the q/k/v column blocks of a packed [K, 3N] weight."""
    a = np.moveaxis(array, axis, 0)
    if not digests or a.ndim != 2 or a.shape[1] % 3:
        return []
    blocks = np.split(a, 3, axis=1)
    return [digests[d] for d in (weight_digest(b, 0) for b in blocks) if d in digests]


def check_node(node: ir.Node, expected: frozenset[str], digests: dict[str, str] | None = None) -> LayerSparsity | None:
    spec = _reduction_axis(node)
    if spec is None or len(node.inputs) <= spec[0]:
        return None
    index, axis = spec
    found = _constant(node.inputs[index], axis)
    if isinstance(found, str):
        return LayerSparsity(node.name or "?", node.name or "?", node.op_type, "", [], axis, "skipped", found)
    array, axis, weight, path = found
    covers = _packed(array, axis, digests or {}) if node.op_type in FUSED else []
    layer = node.name if node.op_type in FUSED and node.name else _layer_name(node, weight)
    via = f" (via {path})" if path else ""
    via += f"; packs {', '.join(covers)}" if covers else ""
    entry = LayerSparsity(layer, node.name or "?", node.op_type, weight, list(array.shape), axis % array.ndim,
                          "skipped", "", covers=covers)
    k = array.shape[axis]
    if array.ndim < 2:
        entry.reason = "weight has rank < 2"
        return entry
    if k % 4:
        entry.reason = f"reduction axis {axis % array.ndim} has length {k}, not a multiple of 4"
        return entry
    entry.groups_ok = groups_ok(array, axis)
    meant = layer in expected or weight in expected or any(c in expected for c in covers)
    if entry.groups_ok == 1.0:
        entry.status, entry.reason = "sparse", f"2:4 along axis {entry.axis} (K={k}){via}"
    elif meant or entry.groups_ok >= MOSTLY_SPARSE:
        why = "marked sparse by edgeattn sparsify" if meant else "most groups are 2:4"
        entry.status = "broken"
        entry.reason = f"{why}, but {1 - entry.groups_ok:.2%} of the groups of 4 along axis {entry.axis} hold fewer than 2 zeros{via}"
    else:
        entry.status, entry.reason = "dense", f"{entry.groups_ok:.1%} of groups of 4 are 2:4{via}"
    return entry


def expected_layers(model: ir.Model) -> frozenset[str]:
    raw = model.metadata_props.get(METADATA_KEY)
    try:
        return frozenset(json.loads(raw)) if raw else frozenset()
    except json.JSONDecodeError:
        return frozenset()


def recorded_digests(model: ir.Model) -> dict[str, str]:
    """Weight digest -> layer name, from the model's `edgeattn.sparse_weights` metadata."""
    raw = model.metadata_props.get(WEIGHTS_KEY)
    try:
        return {digest: layer for layer, digest in json.loads(raw).items()} if raw else {}
    except (json.JSONDecodeError, AttributeError):
        return {}


def check_model(model: ir.Model) -> list[LayerSparsity]:
    """One entry per MatMul / Gemm / Conv node (and fused Attention / QAttention kernel), in graph order."""
    expected, digests = expected_layers(model), recorded_digests(model)
    found = [check_node(n, expected, digests) for n in model.graph.all_nodes()]
    return [e for e in found if e is not None]


def sparse_metadata(model: ir.Model, pruned: list[str]) -> dict[str, str]:
    """Metadata naming the pruned layers the graph holds (a layer the export left out, such as an unused
    pooler, is not expected in it) with the digests of their weights: {METADATA_KEY: ..., WEIGHTS_KEY: ...}."""
    wanted, digests = set(pruned), {}
    for node in model.graph.all_nodes():
        spec = _reduction_axis(node)
        if spec is None or len(node.inputs) <= spec[0]:
            continue
        found = _constant(node.inputs[spec[0]], spec[1])
        if isinstance(found, str):
            continue
        array, axis, weight, _ = found
        layer = _layer_name(node, weight)
        name = layer if layer in wanted else weight if weight in wanted else None
        if name is not None and array.ndim >= 2:
            digests[name] = weight_digest(array, axis % array.ndim)
    return {METADATA_KEY: json.dumps([n for n in pruned if n in digests]), WEIGHTS_KEY: json.dumps(digests)}


class CheckSparsity:
    name = "check-sparsity"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        layers = check_model(model)
        expected = expected_layers(model)
        sparse = [e.layer for e in layers if e.sparse]
        seen = {e.layer for e in layers} | {e.weight for e in layers} | {c for e in layers for c in e.covers}
        problems = [f"2:4 sparsity broken in {e.layer} ({e.node}): {e.reason}" for e in layers if e.status == "broken"]
        problems += [f"2:4 sparsity: layer {name} is marked sparse but no MatMul/Gemm/Conv weight of that name was found"
                     for name in sorted(expected - seen)]
        enable = bool(sparse) and ctx.target.sparse_tensor_cores
        if sparse and not ctx.target.sparse_tensor_cores:
            note = f"; target {ctx.target.name} has no sparse tensor cores, so they run dense"
        elif enable:
            note = "; sparse weights enabled for the engine build"
        else:
            note = ""
        counts = {s: sum(e.status == s for e in layers) for s in ("sparse", "dense", "broken", "skipped")}
        packed = sum(len(e.covers) for e in layers)
        fused = f" ({packed} pruned layers packed into fused attention weights)" if packed else ""
        summary = ", ".join(f"{v} {k}" for k, v in counts.items()) + f" of {len(layers)} weighted layers{fused}{note}"
        details = {"sparse_layers": sparse, "enable_sparse_weights": enable, "counts": counts,
                   "sparse_tensor_cores": ctx.target.sparse_tensor_cores,
                   "layers": [{**asdict(e), "sparse": e.sparse} for e in layers]}
        raw = model.metadata_props.get(DECISIONS_KEY)
        if raw:
            try:
                details["sparsify_decisions"] = json.loads(raw)
            except json.JSONDecodeError:
                problems.append(f"metadata {DECISIONS_KEY} is not JSON: the sparsify decisions are lost")
        return PassResult(self.name, False, summary, details, problems)
