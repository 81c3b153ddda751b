"""Lower edgeattn::CachedWindowedAttention to plain ops for ONNX Runtime, with the ring geometry built once.

The op's ONNX body (edgeattn.attention.cached_function) computes, in every layer, which ring rows the window
reads and the masks of the sink, window and chunk keys: ~90 of its 136 nodes, identical in every layer but
recomputed 30 times in SmolLM2, because each copy reads the shapes of its own cache input. On a CPU, where
a decode step is a few thousand small nodes, that overhead is most of a step at short contexts.

This pass replaces each node by ~20 data nodes reading one shared geometry (the gather indices of the
window rows and of the sink + window rows, and one additive bias `[B, 1, G*S, L]`, L = sink rows + window
rows + the chunk's keys), built once per step from `cache_position`, `attention_window` and the shapes:
one Gather of the window keys and a Slice of the sink keys, three score products (sinks with the second
query rotation, window, chunk) concatenated, one Softmax, and the weighted sum as two products (the sink +
window values from one Gather, the chunk's own values). No cache rows are copied but by the Gathers: the
keys and values are never concatenated with the chunk's, only the scores are (W times smaller at a step). The result is the body's, op for op the same rule
(tests/test_cached_attention_cpu.py checks it against the float64 oracle and the body).

With `edgeattn build --cached-attention fused` a node goes instead to ONNX Runtime's GroupQueryAttention where
it can (cached_attention_gqa: fewer nodes, a slower kernel per cached row; this pass runs after
fuse-rotary-cpu because that form reads its angle tables).

Nodes share one geometry when they read the same position and window inputs, have the same sinks, head
layout, and caches and queries whose shapes are the same symbolic dims; others get their own (never a
silent change of meaning). Nodes the lowering cannot take (not float32, head counts not static, the attention
budget's page inputs) keep the op and are listed with the reason.
"""

from __future__ import annotations

import zlib

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common

from edgeattn.attention import DOMAIN
from edgeattn.attention.cached_function import CACHED_INPUTS, CACHED_OP_TYPE
from edgeattn.passes import PassContext, PassResult
from edgeattn.passes import cached_attention_gqa as gqa
from edgeattn.passes.rewiring import constant, replace_value


class LowerCachedAttentionForCpu:
    name = "lower-cached-cpu"

    def __call__(self, model: ir.Model, ctx: PassContext) -> PassResult:
        nodes = [n for n in model.graph if n.domain == DOMAIN and n.op_type == CACHED_OP_TYPE]
        if not nodes:
            return PassResult(self.name, False, "no CachedWindowedAttention in the model", {"lowered": 0})
        lowered, geometries, kept, forms = lower_cached(model, form=ctx.cached_attention, rotary_rows=ctx.rotary_rows)
        details = {"lowered": lowered, "geometries": geometries, "kept": kept,
                   "group_query_attention": forms["fused"], "plain": forms["plain"]}
        if forms.get("rotary"):
            details["rotary"] = forms["rotary"]
        if not kept:
            common.RemoveUnusedFunctionsPass()(model)
            if not any(n.domain == DOMAIN for n in model.graph.all_nodes()):
                model.opset_imports.pop(DOMAIN, None)
        problems = [f"CachedWindowedAttention {name} kept as the op (its ONNX body runs): {why}"
                    for name, why in kept.items()]
        problems += [f"CachedWindowedAttention {name} lowered to plain ops, not GroupQueryAttention: {why}"
                     for name, why in forms["plain"].items()]
        summary = (f"{lowered} cached attention layers lowered to plain ops reading {geometries} shared ring geometry"
                   if not forms["fused"] else f"{lowered} cached attention layers lowered ({forms['fused']} on "
                   f"GroupQueryAttention), reading {geometries} shared ring geometry")
        return PassResult(self.name, lowered > 0, summary, details, problems)


def _why_not(node: ir.Node) -> str | None:
    q, k, pk = node.inputs[0], node.inputs[2], node.inputs[4]
    for name, value in (("q", q), ("k", k), ("past_key", pk)):
        if value.dtype != ir.DataType.FLOAT:
            return f"{name} is {value.dtype}, the lowering handles float32"
        if value.shape is None or len(value.shape) != 4:
            return f"{name} is not known to be 4-D"
    if len(node.inputs) > len(CACHED_INPUTS):
        bounds = node.inputs[len(CACHED_INPUTS) + 1]
        if bounds.dtype != ir.DataType.FLOAT:
            return f"key_bounds is {bounds.dtype}, the lowering handles float32"
        if bounds.shape is None or len(bounds.shape) != 5:
            return "key_bounds is not known to be 5-D ([B, H_kv, P, 2, D])"
    h, hkv, d = q.shape[1], pk.shape[1], q.shape[3]
    if not all(isinstance(x, int) for x in (h, hkv, d)) or h % hkv:
        return f"heads {h} / kv heads {hkv} / head dim {d}: expected static, heads a multiple of kv heads"
    if node.attributes.get_float("softcap", 0.0):
        return "its scores are soft-capped (softcap), which the lowering does not do"
    return None


def _dim_key(value: ir.Value, axis: int):
    dim = value.shape[axis]
    if isinstance(dim, int):
        return dim
    if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
        return f"sym:{dim.value}"
    return f"value:{id(value)}"  # unknown: only this value is known to have it


def lower_cached(model: ir.Model, *, form: str = "ops", rotary_rows: int | None = None
                 ) -> tuple[int, int, dict[str, str], dict]:
    """Returns (nodes lowered, geometries built, {node kept: why}, {"fused": n, "plain": {node: why}, "rotary":
    how the fast path rotates}).
    form "fused": a node goes to GroupQueryAttention (cached_attention_gqa) when it can, else to plain ops (and
    why); "fast_path": to GroupQueryAttention over the cache buffers themselves (cached_attention_gqa.emit_fast_path;
    the runtime's fast path for streams that have not left their window), else plain ops (and why). With
    `rotary_rows`, the fast path's rotation tables are constants of that many positions where the angles are
    positions times constant frequencies (no per-step Cos / Sin, Pad or position_ids: the runtime keeps the
    streams below that position on the fast path), else the step's own tables."""
    fused, fast_path = form == "fused", form == "fast_path"
    common.ShapeInferencePass()(model)
    graph = model.graph
    shared: dict[tuple, tuple[ir.Value, ir.Value, ir.Value, ir.Value]] = {}  # key -> _geometry's values
    shared_gqa: dict[tuple, dict] = {}
    rings: dict[tuple, dict] = {}
    memo: dict[tuple, tuple[ir.Value, ir.Value]] = {}
    lowered, kept, plain, n_fused = 0, {}, {}, 0
    rotary: dict[str, str] = {}  # the fast path: how each node's rotation tables are made
    budgets: dict[tuple, dict] = {}  # key + the pages input -> _page_geometry's values
    unread: set[ir.Value] = set()  # the fast path: budget inputs of lowered nodes (nothing reads them there)
    no_gqa = gqa.unavailable() if fused or fast_path else None
    for node in [n for n in graph if n.domain == DOMAIN and n.op_type == CACHED_OP_TYPE]:
        reason = _why_not(node)
        if reason:
            kept[node.name or CACHED_OP_TYPE] = reason
            continue
        q, q_sink, k, v, pk, pv, position, window = node.inputs[:len(CACHED_INPUTS)]
        pages, bounds = node.inputs[len(CACHED_INPUTS):] or (None, None)  # the attention budget's inputs
        sinks = node.attributes.get_int("sinks", 0)
        h, hkv, d = q.shape[1], pk.shape[1], q.shape[3]
        g = h // hkv
        scale = node.attributes.get_float("scale", 0.0) or 1.0 / float(np.sqrt(d))
        ns = max(sinks, 1)  # at least one sink row is read (masked when there are no sinks)
        new: list[ir.Node] = []

        def op(op_type, *inputs, outputs: int = 1, _domain: str = "", **attrs):
            n = ir.node(op_type, list(inputs), attributes=attrs, num_outputs=outputs, domain=_domain,
                        name=f"{node.name}/{op_type}{len(new)}")
            new.append(n)
            return n.outputs[0] if outputs == 1 else tuple(n.outputs)

        c = lambda name, value: constant(graph, f"edgeattn_cached_{name}", value)  # noqa: E731
        i64 = lambda x: np.array(x, np.int64)  # noqa: E731
        key = (id(position), id(window), sinks, hkv, g, _dim_key(pk, 2), _dim_key(q, 0), _dim_key(q, 2))
        found = (gqa.match(node, 0 if fast_path else sinks) if no_gqa is None else no_gqa) if fused or fast_path else None
        if fused and pages is not None and isinstance(found, dict):
            found = "it reads the attention budget's retrieval pages, which GroupQueryAttention does not"
        if fast_path and pages is not None:  # inside the window no past row is a page candidate: pages read nothing
            unread.update((pages, bounds))
        if fast_path and isinstance(found, dict) and not _reads_at_least_the_live_window(window):  # min(W, trained)
            found = "its window is capped in the graph (a trained sliding window); the fast path reads every position"
        if isinstance(found, dict) and fast_path:  # no sink rotation: while t <= sinks + W the second one is t itself
            if key not in shared_gqa:
                x3 = gqa.shape_source(found["xq"], h, d)
                if x3 is None:
                    x3 = op("Reshape", op("Transpose", found["xq"], perm=[0, 2, 1, 3]),
                            c(f"bsh_{h * d}", i64([0, 0, h * d])))
                shared_gqa[key] = gqa.fast_path_geometry(op, c, i64, x3, position)
            geo = shared_gqa[key]

            def padded(kind, a, b):
                memo_key = (kind, id(a), id(b), key)
                if memo_key not in memo:
                    memo[memo_key] = (op("Pad", a, geo["rotary_pads"]), op("Pad", b, geo["rotary_pads"]))
                return memo[memo_key]

            inv = gqa.inverse_frequencies(found["f_t"]) if rotary_rows else None
            constant_tables = None
            if inv is not None:
                name = f"rotary_{rotary_rows}_{zlib.crc32(inv.tobytes()):08x}"  # one pair per frequencies
                if ("constant", name) not in memo:
                    cos_t, sin_t = gqa.position_tables(inv, rotary_rows)
                    memo[("constant", name)] = (c(name + "_cos", cos_t), c(name + "_sin", sin_t))
                constant_tables = memo[("constant", name)]
                rotary[node.name or CACHED_OP_TYPE] = f"constant tables of {rotary_rows} positions"
            else:
                rotary[node.name or CACHED_OP_TYPE] = ("the step's tables: no row count given" if not rotary_rows else
                                                       "the step's tables: the angles are not positions x constants")
            out, k_all, v_all = gqa.emit_fast_path(op, c, i64, node, found, geo, padded, h=h, hkv=hkv, d=d, scale=scale,
                                                constant_tables=constant_tables)
        elif isinstance(found, dict):
            if key not in rings:  # shapes from the query before its rotation, which the fused op does itself
                x3 = gqa.shape_source(found["xq"], h, d)
                rings[key] = ring(op, c, i64, x3 if x3 is not None else found["xq"], pk, position, window,
                                  sinks=sinks, hkv=hkv, seq_axis=1 if x3 is not None else 2)
            if key not in shared_gqa:
                shared_gqa[key] = gqa.geometry(op, c, i64, rings[key], sinks=sinks, hkv=hkv)
            geo = shared_gqa[key]

            def tables(kind, a, b):
                memo_key = (kind, id(a), id(b), key)
                if memo_key not in memo:
                    memo[memo_key] = (gqa.offset_tables(op, c, i64, a, b, geo["past_pads"]) if kind == "offset" else
                                      (op("Pad", a, geo["rotary_pads"]), op("Pad", b, geo["rotary_pads"])))
                return memo[memo_key]

            out, k_new, v_new = gqa.emit(op, c, i64, node, found, geo, tables, sinks=sinks, h=h, hkv=hkv, d=d,
                                         scale=scale)
            for old, value in ((k, k_new), (v, v_new)):
                value.shape, value.dtype = old.shape, old.dtype
        if isinstance(found, dict):
            if fast_path:
                k_new, v_new = k_all, v_all
            graph.insert_before(node, new)
            out.shape, out.dtype = node.outputs[0].shape, node.outputs[0].dtype
            bsnh = out.producer().inputs[0]
            replace_value(graph, node.outputs[0], out)
            graph.remove(node, safe=True)
            replace_value(graph, k, k_new)  # the ring is written from the op's own rotation of the keys
            replace_value(graph, v, v_new)
            for use in list(out.uses()):  # [B, H, S, D] read back as [B, S, H, D]: no transpose at all
                t = use.node
                if t.op_type == "Transpose" and list(t.attributes.get_ints("perm", [])) == [0, 2, 1, 3]:
                    replace_value(graph, t.outputs[0], bsnh)
            o3 = bsnh.producer().inputs[0]
            for use in list(bsnh.uses()):  # and [B, S, H, D] read back as [B, S, H*D]: the op's own output
                r = use.node
                if r.op_type == "Reshape" and r.outputs[0].shape is not None and list(r.outputs[0].shape) == list(o3.shape):
                    replace_value(graph, r.outputs[0], o3)
            lowered += 1
            n_fused += 1
            continue
        if fused or fast_path:
            plain[node.name or CACHED_OP_TYPE] = found
        if key not in shared:
            shared[key] = _geometry(op, c, i64, q, pk, position, window, sinks=sinks, hkv=hkv, g=g, ns=ns)
        rows, rows_sv, split_sv, bias = shared[key][:4]
        rings_of = lambda key: shared[key][4]  # noqa: E731
        flat = c(f"flat_{d}", i64([-1, d]))
        qr = op("Reshape", q, c(f"gqa_{hkv}_{d}", i64([0, hkv, -1, d])))  # [B, H_kv, G*S, D]
        qg = op("Mul", qr, c(f"scale_{scale:.9g}", np.array(scale, np.float32)))
        qsg = op("Mul", op("Reshape", q_sink, c(f"gqa_{hkv}_{d}", i64([0, hkv, -1, d]))),
                 c(f"scale_{scale:.9g}", np.array(scale, np.float32)))  # [B, H_kv, G*S, D]
        # keys: three score products concatenated (small), never the keys themselves (W rows a layer)
        pk_rows, pv_rows = op("Reshape", pk, flat), op("Reshape", pv, flat)  # the cache seen as [B*H_kv*C, D]
        kw = op("Gather", pk_rows, rows, axis=0)  # [B, H_kv, N, D]
        ks = op("Slice", pk, c("i0_1", i64([0])), c(f"ns_{ns}", i64([ns])), c("axis2", i64([2])))  # [B, H_kv, NS, D]
        scores = [op("MatMul", query, op("Transpose", key, perm=[0, 1, 3, 2]))  # [B, H_kv, G*S, NS | N | S]
                  for query, key in ((qsg, ks), (qg, kw), (qg, k))]
        if pages is not None:  # the chosen pages' rows: a fourth group of keys in the same Softmax
            bkey = key + (id(pages), _dim_key(bounds, 2))
            if bkey not in budgets:
                budgets[bkey] = _page_geometry(op, c, i64, rings_of(key), split_sv, bias, bounds, pages,
                                               sinks=sinks, hkv=hkv, g=g)
            s_p, v_p = _page_group(op, c, i64, budgets[bkey], qr, qg, pk_rows, pv_rows, bounds, hkv=hkv, g=g, d=d)
            scores = op("Add", op("Concat", *scores, s_p, axis=-1), budgets[bkey]["bias"])  # [B, H_kv, G*S, L + R]
            p_sw, p_n, p_p = op("Split", op("Softmax", scores, axis=-1), budgets[bkey]["split"], axis=-1,
                                outputs=3)  # [.., NS + N], [.., S], [.., R]
        else:
            scores = op("Add", op("Concat", *scores, axis=-1), bias)  # [B, H_kv, G*S, L]
            p_sw, p_n = op("Split", op("Softmax", scores, axis=-1), split_sv, axis=-1, outputs=2)  # [.., NS + N], [.., S]
        # values: the sink and window rows in one Gather, the chunk's own values apart (no copy of the cache rows)
        vsw = op("Gather", pv_rows, rows_sv, axis=0)  # [B, H_kv, NS + N, D]
        parts = [op("MatMul", p_sw, vsw), op("MatMul", p_n, v)]  # [B, H_kv, G*S, D]
        if pages is not None:  # per query row (g, i): [1, R] @ [R, D], the values broadcast over the G query heads
            o_p = op("MatMul", op("Reshape", p_p, budgets[bkey]["by_group"]), v_p)  # [B, H_kv, G, S, 1, D]
            parts.append(op("Reshape", o_p, c(f"gqa_{hkv}_{d}", i64([0, hkv, -1, d]))))
        out = op("Add", *parts) if len(parts) == 2 else op("Sum", *parts)
        out = op("Reshape", out, c(f"heads_{h}_{d}", i64([0, h, -1, d])))  # [B, H, S, D]
        graph.insert_before(node, new)
        out.shape, out.dtype = node.outputs[0].shape, node.outputs[0].dtype
        replace_value(graph, node.outputs[0], out)
        graph.remove(node, safe=True)
        lowered += 1
    if n_fused:
        common.RemoveUnusedNodesPass()(model)
        model.opset_imports.setdefault(gqa.MS, 1)
    for value in unread:  # the fast path's graph does not ask for inputs it never reads
        if value.is_graph_input() and not value.uses():
            graph.inputs.remove(value)
    return lowered, len(shared) + len(shared_gqa), kept, {"fused": n_fused, "plain": plain, "rotary": rotary}


def _reads_at_least_the_live_window(window: ir.Value) -> bool:
    """Whether a node's window is the graph's window input, or a layer kept dense under a budget (the export's
    dense_layers: Where(pages > 0, 0 = the whole ring, the window input)): either way it reads at least the
    live window, so a stream still inside that window reads every position, as the fast path does. A window
    capped in the graph (min(W, a trained window)) reads less."""
    if window.is_graph_input():
        return True
    node = window.producer()
    if node is None or node.op_type != "Where" or not node.inputs[2].is_graph_input():
        return False
    whole = node.inputs[1].const_value
    return whole is not None and whole.numpy().size == 1 and int(whole.numpy().reshape(())) == 0


def ring(op, c, i64, q, pk, position, window, *, sinks: int, hkv: int, seq_axis: int = 2) -> dict[str, ir.Value]:
    """What both lowerings read (the body's rule, cached_function._build_cached): the live window n, the
    ring slots [B, N] and the flat cache rows [B, H_kv, N] of the window keys (the cache seen as [B*H_kv*C, D]), their row offsets
    `base` [B, H_kv, 1], and the masks of the window keys ok_w [B, S, N] and of the chunk's keys ok_n [B, S, S].
    q: any tensor with the batch on axis 0 and the chunk on `seq_axis`."""
    i0, i1 = c("i0", i64(0)), c("i1", i64(1))
    sinks_c = c(f"sinks_{sinks}", i64(sinks))
    axes0, axes1 = c("axes0", i64([0])), c("axes1", i64([1]))
    scalar = c("scalar_shape", i64([]))
    bsz = op("Reshape", op("Shape", q, start=0, end=1), scalar)
    sq_1d = op("Shape", q, start=seq_axis, end=seq_axis + 1)
    sq = op("Reshape", sq_1d, scalar)
    cap = op("Reshape", op("Shape", pk, start=2, end=3), scalar)
    wmax = op("Sub", cap, sinks_c)
    w = op("Reshape", window, scalar)
    w = op("Where", op("Or", op("LessOrEqual", w, i0), op("Greater", w, wmax)), wmax, w)
    pos = op("Unsqueeze", op("Cast", position, to=ir.DataType.INT64), axes1)  # [B, 1]
    filled = op("Sub", op("ReduceMax", pos, keepdims=0), sinks_c)
    n = op("Max", op("Min", w, filled), i1)
    r = op("Range", i0, n, i1)  # [N]
    kpos_w = op("Add", op("Sub", pos, n), op("Unsqueeze", r, axes0))  # [B, N]
    slot_w = op("Add", sinks_c, op("Mod", op("Sub", kpos_w, sinks_c), wmax))
    valid_w = op("And", op("GreaterOrEqual", kpos_w, sinks_c), op("GreaterOrEqual", kpos_w, i0))  # [B, N]
    bh = op("Reshape", op("Range", i0, op("Mul", bsz, c(f"hkv_{hkv}", i64(hkv))), i1),
            op("Concat", op("Unsqueeze", bsz, axes0), c(f"hkv_1_{hkv}", i64([hkv, 1])), axis=0))  # [B, H_kv, 1]
    base = op("Mul", bh, cap)  # [B, H_kv, 1]: row 0 of each (stream, kv head) in the flat cache
    rows = op("Add", base, op("Unsqueeze", slot_w, axes1))  # [B, H_kv, N]
    qi = op("Unsqueeze", op("Range", i0, sq, i1), axes1)  # [S, 1]
    kj = op("Unsqueeze", op("Range", i0, sq, i1), axes0)  # [1, S]
    dist = op("Sub", op("Add", qi, n), op("Unsqueeze", r, axes0))  # [S, N]
    ok_w = op("And", op("Unsqueeze", valid_w, axes1), op("Less", dist, w))  # [B, S, N]
    in_band = op("Or", op("Less", op("Sub", qi, kj), w),
                 op("Unsqueeze", op("Less", op("Add", pos, kj), sinks_c), axes1))  # [B, S, S]
    ok_n = op("And", op("LessOrEqual", kj, qi), in_band)  # [B, S, S]
    return {"bsz": bsz, "sq": sq, "sq_1d": sq_1d, "pos": pos, "n": n, "base": base, "rows": rows, "qi": qi,
            "slots": slot_w, "w": w, "wmax": wmax, "cap": cap,
            "ok_w": ok_w, "ok_n": ok_n}


def _geometry(op, c, i64, q, pk, position, window, *, sinks: int, hkv: int, g: int, ns: int):
    """rows [B, H_kv, N] of the window keys in the cache seen as [B*H_kv*C, D], rows_sv [B, H_kv, NS + N]
    of the sink and window values, the split sizes [NS + N, S] of the probabilities, and the additive bias
    [B, 1, G*S, L], L = NS + N + S."""
    geo = ring(op, c, i64, q, pk, position, window, sinks=sinks, hkv=hkv)
    base, rows, n, sq_1d = geo["base"], geo["rows"], geo["n"], geo["sq_1d"]
    axes0, axes1 = c("axes0", i64([0])), c("axes1", i64([1]))
    rows_sv = op("Concat", op("Add", base, c(f"sink_rows_{ns}", i64(np.arange(ns)))), rows, axis=-1)  # [B, H_kv, NS + N]
    split_sv = op("Concat", op("Unsqueeze", op("Add", n, c(f"ns_scalar_{ns}", i64(ns))), axes0), sq_1d, axis=0)  # [2]
    kpos_s = c(f"sink_pos_{ns}", i64(np.arange(ns)[None]))  # [1, NS]
    ok_s = op("Unsqueeze", op("And", op("Less", kpos_s, c(f"sinks_{sinks}", i64(sinks))),
                              op("Less", kpos_s, geo["pos"])), axes1)  # [B, 1, NS]
    ok_s = op("Expand", ok_s, op("Concat", c("one_1", i64([1])), sq_1d, c("one_1", i64([1])), axis=0))  # [B, S, NS]
    ok = op("Concat", ok_s, geo["ok_w"], geo["ok_n"], axis=-1)  # [B, S, L]
    bias = op("Where", ok, c("f0", np.array(0.0, np.float32)), c("fneginf", np.array(-np.inf, np.float32)))
    bias = op("Unsqueeze", bias, axes1)  # [B, 1, S, L]
    if g > 1:  # query row g*S + i of a KV head reads as row i: [B, 1, G*S, L]
        bias = op("Tile", bias, c(f"tile_{g}", i64([1, 1, g, 1])))
    return rows, rows_sv, split_sv, bias, geo


def _page_geometry(op, c, i64, geo: dict, split_sv, bias, bounds, pages, *, sinks: int, hkv: int, g: int) -> dict:
    """The attention budget's per-step part (the body's rule, cached_function._page_group), from positions and
    shapes alone: the candidate pages of each query cand [B, 1, 1, S, P] (a filled past ring row older than the
    window), the TopK size k' = max(min(k, most candidates of any query), 1) (a run-time k: a stream inside its
    window reads one masked page, whatever k), and what turns the chosen pages into cache rows and their mask.
    A ring row is read iff it holds a candidate position: its ring offset x (row - sinks) lies in the candidates'
    interval, (x - s0) mod W_max < span; so a chosen page that is no candidate reads nothing, and k = 0 (TopK
    still takes one page) is span 0. Everything a layer needs is laid out here for its ops (_page_group): no
    Transpose or Unsqueeze there, and no elementwise op on a tensor whose last axis is 1 (ONNX Runtime's
    broadcasting loops that axis element by element, ~10x slower)."""
    i0, i1 = c("i0", i64(0)), c("i1", i64(1))
    sinks_c = c(f"sinks_{sinks}", i64(sinks))
    axes0 = c("axes0", i64([0]))
    scalar = c("scalar_shape", i64([]))
    pos, w, wmax, sq_1d = geo["pos"], geo["w"], geo["wmax"], geo["sq_1d"]
    npages = op("Reshape", op("Shape", bounds, start=2, end=3), scalar)
    page = op("Div", wmax, npages)  # the bounds' pages cut the ring evenly (page divides W_max)
    k = op("Reshape", pages, scalar)
    # candidates: past ring rows p in [lo, hi], hi = min(pos - 1, t - W), cover the ring offsets [s0, s0 + L)
    # mod W_max; page j (offsets [j*page, (j+1)*page)) holds one iff either interval's start lies in the other
    lo = op("Max", op("Sub", pos, wmax), sinks_c)  # [B, 1]
    t = op("Add", pos, op("Unsqueeze", op("Range", i0, geo["sq"], i1), axes0))  # [B, S]
    span = op("Add", op("Sub", op("Min", op("Sub", pos, i1), op("Sub", t, w)), lo), i1)  # [B, S]: L (<= 0: none)
    s0 = op("Mod", op("Sub", lo, sinks_c), wmax)  # [B, 1]
    s0_, span_ = op("Unsqueeze", s0, c("axes2", i64([2]))), op("Unsqueeze", span, c("axes2", i64([2])))
    start = op("Mul", op("Range", i0, npages, i1), page)  # [P]
    cand = op("Or", op("Less", op("Mod", op("Sub", start, s0_), wmax), span_),
              op("Less", op("Mod", op("Sub", s0_, start), wmax), page))
    cand = op("And", cand, op("Greater", span_, i0))  # [B, S, P]
    most = op("ReduceMax", op("ReduceSum", op("Cast", cand, to=ir.DataType.INT64), c("axes_last", i64([-1])),
                                 keepdims=0), keepdims=0)
    kk = op("Max", op("Min", k, most), i1)  # >= 1: zero-sized tensors break older ORT
    page_1d = op("Unsqueeze", page, axes0)
    r_1d = op("Unsqueeze", op("Mul", kk, page), axes0)  # R = k' * page rows a query
    read = op("Where", op("Greater", k, i0), span, i0)  # [B, S]: k = 0 reads no row (TopK still takes one page)
    # the ring rows of every page, [P, page]: W_max numbers once a step, shared by every stream and layer
    page_rows = op("Reshape", op("Range", sinks_c, op("Add", sinks_c, wmax), i1),
                   op("Concat", c("minus_1", i64([-1])), page_1d, axis=0))
    return {"kk_1d": op("Unsqueeze", kk, axes0), "wmax": wmax, "page_rows": page_rows,
            "cand": op("Unsqueeze", cand, c("axes12", i64([1, 2]))),  # [B, 1, 1, S, P]
            "rows_shape": op("Concat", op("Unsqueeze", geo["bsz"], axes0), c(f"hkv_1_{hkv}", i64([hkv, 1])), sq_1d,
                             r_1d, axis=0),  # [B, H_kv, 1, S, R]
            "base": op("Unsqueeze", geo["base"], c("axes34", i64([3, 4]))),  # [B, H_kv, 1, 1, 1]: flat row 0
            "s0": op("Unsqueeze", op("Add", s0, sinks_c), c("axes234", i64([2, 3, 4]))),  # [B, 1, 1, 1, 1]
            "span": op("Unsqueeze", read, c("axes124", i64([1, 2, 4]))),  # [B, 1, 1, S, 1]
            "by_group": op("Concat", c(f"groups_{g}_1", i64([0, 0, g, -1, 1])), r_1d, axis=0),  # [B, H_kv, G, S, 1, R]
            "flat_groups": op("Concat", c("shape_0_0_m1", i64([0, 0, -1])), r_1d, axis=0),  # -> [B, H_kv, G*S, R]
            "split": op("Concat", split_sv, r_1d, axis=0),  # [NS + N, S, R]
            # the window's bias [B, 1, G*S, L] and 0 for the pages' rows (their scores are -inf where not read)
            "bias": op("Pad", bias, op("Concat", c("zeros_7", i64([0] * 7)), r_1d, axis=0))}


def _page_group(op, c, i64, geo: dict, qr, qg, pk_rows, pv_rows, bounds, *, hkv: int, g: int, d: int):
    """One layer's pages: every page's score, q . (min + max) = [q, q] . [min, max] (one product: twice q . the
    centre of its key bounds, the same order), its max over the G query heads of a KV head, TopK of the candidates,
    and the chosen pages' rows gathered (k' * page rows a query, never the cache). The scores are one row's keys times a
    query column, batched over (B, H_kv, G, S) with the keys broadcast over G: no Transpose. qr, qg: the queries
    [B, H_kv, G*S, D] unscaled and scaled. -> scores [B, H_kv, G*S, R] (scaled, -inf where a row is not read: not
    taken, empty, or a window row) and values [B, H_kv, 1, S, R, D]."""
    neg_inf = c("fneginf", np.array(-np.inf, np.float32))
    drop_last = c("drop_last_5", i64([0, 0, 0, 0, -1]))  # [.., X, 1] -> [.., X]
    qq = op("Concat", qr, qr, axis=-1)  # [.., G*S, 2D]
    qq = op("Reshape", qq, c(f"query_col_{hkv}_{g}_{2 * d}", i64([0, hkv, g, -1, 2 * d, 1])))  # [B,H_kv,G,S,2D,1]
    kb = op("Reshape", bounds, c(f"bounds_{hkv}_{2 * d}", i64([0, hkv, 1, 1, -1, 2 * d])))  # [B,H_kv,1,1,P,2D]
    bound = op("Reshape", op("MatMul", kb, qq), drop_last)  # [B, H_kv, G, S, P]: the bounds are not copied
    if g > 1:
        bound = op("ReduceMax", bound, c("axes2", i64([2])), keepdims=1)  # [B, H_kv, 1, S, P]
    _, chosen = op("TopK", op("Where", geo["cand"], bound, neg_inf), geo["kk_1d"], axis=-1, largest=1, sorted=1,
                   outputs=2)  # [B, H_kv, 1, S, k']: ties, the lower page first
    rows = op("Reshape", op("Gather", geo["page_rows"], chosen, axis=0), geo["rows_shape"])  # [B, H_kv, 1, S, R]
    ok = op("Less", op("Mod", op("Sub", rows, geo["s0"]), geo["wmax"]), geo["span"])  # [B, H_kv, 1, S, R]
    flat = op("Add", rows, geo["base"])  # rows of the cache seen as [B*H_kv*C, D]
    kp = op("Gather", pk_rows, flat, axis=0)  # [B, H_kv, 1, S, R, D]
    vp = op("Gather", pv_rows, flat, axis=0)
    qc = op("Reshape", qg, c(f"query_col_{hkv}_{g}_{d}", i64([0, hkv, g, -1, d, 1])))  # [B, H_kv, G, S, D, 1]
    s = op("Reshape", op("MatMul", kp, qc), drop_last)  # [B, H_kv, G, S, R]
    return op("Reshape", op("Where", ok, s, neg_inf), geo["flat_groups"]), vp
