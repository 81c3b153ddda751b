"""What an attention mask in a graph means, found by running it.

Exporters spell masks in many ways (additive 0/-inf floats, bool tensors through Where, the opset-23
Attention op's mask; built with Range, Trilu, GatherND, ...). Instead of matching every spelling, we
run the part of the graph that computes the masks in ONNX Runtime on a small probe (batch 2, sequence
PROBE_SEQ, the second row right-padded) and compare what each mask allows with what the op computes:
causal or not, with or without the model's padding mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

PROBE_BATCH, PROBE_SEQ, PROBE_PADDED = 2, 7, 2  # the second row ends with 2 padding tokens
BLOCKED = -1e4  # additive mask entries at or below this block a key


@dataclass(frozen=True)
class MaskMeaning:
    causal: bool
    padded: bool  # True: the model's padding mask is part of it


def _ancestors(graph: onnx.GraphProto, outputs: list[str]) -> onnx.GraphProto:
    """The nodes and initializers `outputs` depend on (the rest of a big model stays out)."""
    producer = {o: n for n in graph.node for o in n.output}
    need, seen, stack = [], set(), list(outputs)
    while stack:
        name = stack.pop()
        node = producer.get(name)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        need.append(node)
        stack.extend(i for i in node.input if i)
        for attr in node.attribute:  # names used inside subgraphs
            if attr.type == onnx.AttributeProto.GRAPH:
                stack.extend(i for n in attr.g.node for i in n.input if i)
    order = {id(n): i for i, n in enumerate(graph.node)}
    need.sort(key=lambda n: order[id(n)])
    used = {i for n in need for i in n.input}
    inits = [t for t in graph.initializer if t.name in used]
    inputs = [v for v in graph.input if v.name in used]
    outs = [onnx.helper.make_empty_tensor_value_info(o) for o in outputs]
    return onnx.helper.make_graph(need, "masks", inputs, outs, inits)


def _empty_cache_dims(specs) -> dict[str, int]:
    """KV-cache inputs (Optimum's past_key_values.N.key, ...) are probed empty: the past length is 0, so
    every other sequence dim (new tokens, past + new in the mask) is PROBE_SEQ and they agree."""
    token_dims = {d for s in specs if s.role == "token_ids" for d in s.dims}  # never empty the new tokens
    return {dim: 0 for s in specs if any(word in s.name.lower() for word in ("past", "cache")) and len(s.dims) == 4
            for dim in s.dims[1:] if isinstance(dim, str) and dim not in token_dims}


def probe_feeds(model: onnx.ModelProto) -> tuple[dict[str, np.ndarray], str | None]:
    """Sample inputs for the probe and the name of the padding-mask input (None if the model has none)."""
    from edgeattn.onnx_model import signature
    from edgeattn.sample_inputs import make_inputs

    specs = signature(model).inputs
    sizes = _empty_cache_dims(specs)
    for spec in specs:
        for axis, dim in enumerate(spec.dims):
            if isinstance(dim, str):
                sizes.setdefault(dim, PROBE_BATCH if axis == 0 else PROBE_SEQ)
    feeds = make_inputs(specs, sizes)
    pad = next((s.name for s in specs if s.role == "mask" and len(s.dims) == 2), None)
    if pad is not None:
        feeds[pad][1, -PROBE_PADDED:] = 0
    return feeds, pad


def probe(model: onnx.ModelProto, names: list[str]) -> tuple[dict[str, np.ndarray | str], str | None]:
    """Run the graph up to `names`: name -> value (or why it could not be computed); and the padding input."""
    import onnxruntime as ort

    feeds, pad = probe_feeds(model)
    sub = onnx.helper.make_model(_ancestors(model.graph, names), opset_imports=model.opset_import,
                                 ir_version=model.ir_version)
    sub.functions.extend(model.functions)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(sub.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        wanted = {i.name for i in sess.get_inputs()}
        values = sess.run(names, {k: v for k, v in feeds.items() if k in wanted})
    except Exception as exc:  # ORT raises its own exception types
        reason = f"the mask could not be evaluated on a {PROBE_BATCH}x{PROBE_SEQ} probe ({str(exc).splitlines()[0][:160]})"
        return {n: reason for n in names}, pad
    return dict(zip(names, values)), pad


def allowed_from(value: np.ndarray, kind: str) -> np.ndarray | str:
    """[B, S_q, S_k] bool of attended keys, from an additive ('add') or boolean ('keep') mask value."""
    if value.ndim > 4 or value.ndim < 2:
        return f"mask of rank {value.ndim}: expected 2 to 4"
    if kind == "add":
        if not np.issubdtype(value.dtype, np.floating):
            return f"additive mask of type {value.dtype}: expected float"
        blocked, open_ = value <= BLOCKED, value == 0
        if not np.all(blocked | open_):
            return "the additive mask holds values other than 0 and -inf (a bias such as ALiBi or relative positions)"
        allowed = open_
    else:
        allowed = value.astype(bool)
    allowed = np.broadcast_to(allowed.reshape((1,) * (4 - allowed.ndim) + allowed.shape),
                              (PROBE_BATCH, allowed.shape[-3] if allowed.ndim == 4 else 1, PROBE_SEQ, PROBE_SEQ))
    if not all(np.array_equal(allowed[:, 0], allowed[:, h]) for h in range(allowed.shape[1])):
        return "the mask differs between heads"
    return allowed[:, 0]


def meaning(allowed: np.ndarray | str, padding_input: str | None, *, is_causal: bool = False) -> MaskMeaning | str:
    """Which (causal, padded) the allowed matrix equals on real query rows, or why none does."""
    if isinstance(allowed, str):
        return allowed
    s = PROBE_SEQ
    real = np.ones((PROBE_BATCH, s), bool)
    real[1, s - PROBE_PADDED:] = padding_input is None
    tril = np.tril(np.ones((s, s), bool))
    if is_causal:
        allowed = allowed & tril
    for causal in (True, False):
        for padded in ((True, False) if padding_input else (False,)):
            want = np.broadcast_to(tril if causal else np.ones((s, s), bool), (PROBE_BATCH, s, s))
            if padded:
                want = want & real[:, None, :]
            if all(np.array_equal(allowed[b][real[b]], want[b][real[b]]) for b in range(PROBE_BATCH)):
                return MaskMeaning(causal, padded)
    return "the mask is neither causal nor bidirectional attention over the padding mask (a sliding window or custom pattern)"
