"""A cpu decoder's fast path graph (`model.fast_path.onnx`), built by the fast path plan and checked here.

The same passes as the cpu plan, with the cached attention as GroupQueryAttention over the cache buffers
themselves (passes/cached_attention_gqa.emit_fast_path). The runtime (runtime/generation/fast_path.py) runs
it, with the present outputs bound to the cache's memory, for the steps of streams that have not left their
window (no ring wrap and t <= sinks + W: plain causal attention), and the ring graph for every other step.
Written only when every layer took that form.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np
import onnx_ir as ir

from edgeattn.attention.ring import RingLayout
from edgeattn.decoder.metadata import LOGITS_TO_KEEP, PAGES_INPUT, bounds_names, past_names, present_names
from edgeattn.passes import PassContext, PassResult
from edgeattn.passes.plans import BuildPlan
from edgeattn.runtime.generation.cache import KVCache
from edgeattn.runtime.generation.fast_path import FastPath

FAST_PATH_NAME = "model.fast_path.onnx"


def build_fast_path(model: ir.Model, plan: BuildPlan, ctx: PassContext, cpu_results: list[PassResult],
                    decoder: dict, out: Path, progress: Callable[[str], None], artifact: Path | None = None
                    ) -> dict | None:
    """Run the fast path plan (`plans.fast_path_of` the cpu plan) on `model` (a copy of the source, changed in
    place) and save it to `out`; what the cached attention lowering did, or None (and nothing written) when a
    layer did not take the form. Weights equal to ones `artifact` keeps in its side file are not written again:
    the fast path points at them there (`shared_bytes`)."""
    lowering = next((r for r in cpu_results if r.name == "lower-cached-cpu"), None)
    if lowering is None or not lowering.details.get("lowered"):
        return None
    # rotation tables as constants over the model's positions (and at least the default ring's)
    rows = max(int(decoder.get("max_positions") or 0), int(decoder["sinks"]) + int(decoder["window_max"]))
    ctx = dataclasses.replace(ctx, cached_attention="fast_path", rotary_rows=rows)
    results = plan.run(model, ctx)
    done = dict(next(r for r in results if r.name == "lower-cached-cpu").details)
    if done.get("group_query_attention") != lowering.details["lowered"]:
        progress(f"fast path: not written ({done.get('plain') or done.get('kept')})")
        return None
    rotary = done.get("rotary") or {}
    if rotary and all(how.startswith("constant") for how in rotary.values()):
        done["rotary_rows"] = rows
    else:
        progress(f"fast path: the step's own rotation tables ({sorted(set(rotary.values()))})")
    keep = model.graph.initializers.pop(LOGITS_TO_KEEP, None)  # an input the runtime always binds
    if keep is not None:
        keep.const_value = None
    done["shared_bytes"] = share_weights(model, artifact) if artifact is not None else 0
    ir.save(model, out)
    progress(f"fast path: {out.name} ({done['group_query_attention']} layers on GroupQueryAttention; "
             f"{done['shared_bytes'] / 2**20:.1f} MiB of weights shared with {artifact.name if artifact else '-'})")
    return done


def share_weights(model: ir.Model, artifact: Path) -> int:
    """Point `model`'s initializers at the byte-identical tensors `artifact` (an ONNX file beside the model)
    keeps as external data, instead of holding copies; the bytes shared. Only tensors with the same name,
    type, shape and bytes are shared."""
    import onnx

    saved = {t.name: t for t in onnx.load(str(artifact), load_external_data=False).graph.initializer
             if t.data_location == onnx.TensorProto.EXTERNAL}
    shared = 0
    for name, value in model.graph.initializers.items():
        tensor, proto = value.const_value, saved.get(name)
        if tensor is None or proto is None or tensor.dtype != ir.DataType(proto.data_type) or \
                list(tensor.shape) != list(proto.dims):
            continue
        info = {e.key: e.value for e in proto.external_data}
        offset, length = int(info.get("offset", 0)), int(info["length"])
        data = tensor.tobytes()
        if len(data) != length:
            continue
        with open(artifact.parent / info["location"], "rb") as f:
            f.seek(offset)
            if f.read(length) != data:
                continue
        value.const_value = ir.ExternalTensor(info["location"], offset, length, tensor.dtype, shape=tensor.shape,
                                              name=name, base_dir=artifact.parent)
        shared += length
    return shared


def compare_fast_path(ring, fast_path_model: Path, decoder: dict) -> dict:
    """The fast path against the ring artifact (`ring`: an active OnnxRuntimeBackend): a 6-token chunk at
    position 0 then one token, both from empty caches, every position's logits. The fast path runs as the
    runtime runs it (runtime/generation/fast_path.py: its present outputs bound to the cache's memory)."""
    layers = int(decoder["layers"])
    page = int(decoder.get("page") or 0)  # the attention budget's bounds: the ring model reads them (pages 0)
    layout = RingLayout(int(decoder["sinks"]), page * -(-16 // page) if page else 16)
    geometry = dict(layers=layers, kv_heads=int(decoder["kv_heads"]), head_dim=int(decoder["head_dim"]),
                    layout=layout, page=page)
    ring_cache, fast_cache = KVCache(**geometry), KVCache(**geometry)
    fast = FastPath(fast_path_model, threads=0, past=past_names(layers), present=present_names(layers))
    rng = np.random.default_rng(0)
    worst, largest, agree, positions = 0.0, 0.0, 0, 0
    for chunk in (6, 1):
        ids = rng.integers(0, int(decoder["vocab_size"]), (1, chunk)).astype(np.int64)
        feeds = {"input_ids": ids, "cache_position": ring_cache.positions.copy(),
                 "attention_window": np.array(0, np.int64), LOGITS_TO_KEEP: np.array(0, np.int64),
                 **dict(zip(past_names(layers), ring_cache.past(slice(0, 1))))}
        if page:
            feeds.update({PAGES_INPUT: np.array(0, np.int64),
                          **dict(zip(bounds_names(layers), ring_cache.past_bounds(slice(0, 1))))})
        outs = ring.infer(feeds)
        ring_cache.write([outs[n] for n in present_names(layers)], [0])
        want = outs["logits"]
        got = fast.step(fast_cache, 0, ids, 0, last_only=False)
        worst = max(worst, float(np.abs(got - want).max()))
        largest = max(largest, float(np.abs(want).max()))
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        positions += chunk
    return {"max_abs_diff": worst, "reference_max_abs": largest, "greedy_agreement": agree / positions}
