"""Sequential calibrated 2:4 pruning: each layer is pruned on the inputs the already-pruned layers give it.

One-shot calibration (`sparsity_calibrate.collect_grams`) takes every layer's input statistics from the
dense model, so each layer is fitted to inputs it will never see once the layers before it are pruned;
the errors then compound through the depth. Here, as in SparseGPT's own recipe, the model's repeated
blocks (the longest `nn.ModuleList` holding the Linear layers to prune) are walked in order: the
calibration inputs of block 0 are captured once, and inside each block the Linear layers are pruned
stage by stage (layers that read the same tensor, such as q/k/v or gate/up, form one stage), each stage on
the block's outputs as they are after the previous stages were pruned. The block's pruned outputs become
the next block's inputs. Layers outside the blocks (a pooler) are pruned last, on the pruned model's inputs.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from edgeattn.errors import ModelError
from edgeattn.optional import require
from edgeattn.quantize.progress import StepProgress
from edgeattn.quantize.sparsity.calibrate import collect_grams, prune_layer_


class _Captured(Exception):
    """Raised by the capture hook: the rest of the model need not run."""


def find_blocks(model, linears: dict) -> list:
    """The repeated transformer blocks: the longest ModuleList whose members hold any of `linears`."""
    torch = require("torch")
    wanted = {id(m) for m in linears.values()}
    best: list = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > len(best):
            if any(id(m) in wanted for block in module for m in block.modules()):
                best = list(module)
    if not best:
        raise ModelError("sequential 2:4 pruning: expected a ModuleList of transformer blocks holding the "
                         "Linear layers, found none (use method 'calibrated')")
    return best


def _capture_block_inputs(model, block, batches: Iterable[dict]) -> list[tuple[tuple, dict]]:
    """(args, kwargs) of every call of `block` while the model runs the calibration batches."""
    torch = require("torch")
    device = next(model.parameters()).device
    calls: list[tuple[tuple, dict]] = []

    def hook(module, args, kwargs):
        kwargs = dict(kwargs)
        for key in ("cache", "past_key_values", "past_key_value"):  # re-running a block must not grow a KV cache
            if key in kwargs:
                kwargs[key] = None
        if "use_cache" in kwargs:
            kwargs["use_cache"] = False
        calls.append((args, kwargs))
        raise _Captured

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            for batch in batches:
                try:
                    model(**{k: v.to(device) for k, v in batch.items()})
                except _Captured:
                    pass
    finally:
        handle.remove()
    return calls


def _stages(block, names: dict, calls) -> list[list[str]]:
    """Layers of `block` to prune, grouped by the tensor they read, in the order the forward reaches them."""
    torch = require("torch")
    seen: dict[int, list[str]] = {}
    order: list[int] = []
    alive: list = []  # the inputs stay referenced, so no later tensor can reuse an id
    handles = []

    def hook(name):
        def fn(module, args):
            key = id(args[0])
            alive.append(args[0])
            if key not in seen:
                seen[key] = []
                order.append(key)
            if name not in seen[key]:
                seen[key].append(name)
        return fn

    for name, m in names.items():
        handles.append(m.register_forward_pre_hook(hook(name)))
    try:
        with torch.no_grad():
            args, kwargs = calls[0]
            block(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    stages = [seen[k] for k in order]
    missed = sorted(set(names) - {n for s in stages for n in s})
    return stages + ([missed] if missed else [])  # layers the forward never reached: pruned last, by magnitude


def _hidden(out):
    return out[0] if isinstance(out, tuple) else out


def prune_sequential_(model, chosen: dict, calibration: Iterable[dict],
                      progress: Callable[[str], None] = lambda msg: None) -> None:
    """Prune every Linear in `chosen` (name -> module) to 2:4, in place, masks applied, block by block."""
    torch = require("torch", "2:4 sparsity")
    calibration = list(calibration)
    blocks = find_blocks(model, chosen)
    calls = _capture_block_inputs(model, blocks[0], calibration)
    done: set[str] = set()
    started = time.time()

    def prune(names: dict, grams: dict) -> None:
        for name, module in names.items():
            prune_layer_(module, grams.pop(name))
            done.add(name)

    with torch.no_grad():
        for i, block in enumerate(blocks):
            in_block = {id(m) for m in block.modules()}
            names = {n: m for n, m in chosen.items() if id(m) in in_block}
            if names and calls:
                for stage in _stages(block, names, calls):
                    layers = {n: names[n] for n in stage}
                    grams = collect_grams(block, layers, ({"__call__": c} for c in calls), runner=_run_call)
                    prune(layers, grams)
            new_calls = []
            for args, kwargs in calls:
                out = _hidden(block(*args, **kwargs))
                if args:
                    new_calls.append(((out, *args[1:]), kwargs))
                else:
                    new_calls.append((args, {**kwargs, "hidden_states": out}))
            calls = new_calls
            progress(StepProgress("pruning", i + 1, len(blocks), time.time() - started, unit="block"))
        rest = {n: m for n, m in chosen.items() if n not in done}
        if rest:  # outside the blocks (e.g. a pooler): statistics from the pruned model
            prune(rest, collect_grams(model, rest, calibration))


def _run_call(block, item) -> None:
    args, kwargs = item["__call__"]
    block(*args, **kwargs)
