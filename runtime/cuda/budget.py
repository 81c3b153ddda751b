"""The attention budget on the GPU decode engine (docs/windowed-attention.md, "The attention budget").

A query reads the sinks, the recent window W and the k ring pages (of `page` rows) whose key bounds score highest
for it. The cache keeps, beside its keys and values, per layer the bounds [streams, H_kv, P, 3, D] of every page
(min, max and their sum, which the selection reads: one vector a page instead of two; `attach_bounds`: made from
the rows the first time a budget is asked for, then kept by every write). A decode
step with k > 0 replays a `BudgetGraph`: per layer `torch.ops.edgeattn.ring_decode_budget` chooses the pages on
the device and attends over the cache as it was before the new token, then writes the row and its page's
bounds. k is a device scalar like the window: a graph captured for K_MAX (the next power of two >= k) replays
every k up to it. Steps with k = 0 on a cache that holds bounds replay today's step unchanged (`BoundsGraph`)
and then refresh the written pages' bounds, so a budget asked for later finds them right. Prefill chunks with
k > 0 run the op's PyTorch form (edgeattn.attention.cached_torch) eagerly, layer by layer.

Known limit: as in the window's step, rows n..bucket-1 of a bucket run along and write the row their stream
would write next. For a stream that is still prefilling past the ring, that row held its position t - window_max,
which the window never reads but a later chunk's chosen page may: that one row then reads as the padding token's.
"""

from __future__ import annotations

import numpy as np

from edgeattn.errors import ConfigError
from edgeattn.optional import require
from edgeattn.runtime.cuda.decode_step import (DecodeGraph, PackedDecoder, _angles, _compiled, _rms_norm,
                                               decode_logits, layer_head, layer_tail)

torch = require("torch", "generation on CUDA")

DEFAULT_PAGE = 16  # rows per page (Quest's)
BOUND_SLOTS = 3  # a page's bounds: min, max and min + max (the selection's one read a page; 2: summed from min, max)


def budget_link(h, o, wo, ln2, wgu, wd, ln1, wqkv, bqkv, qn, kn, cos, sin, cos_s, sin_s, *, shape):
    """One layer's tail and the next layer's head as one piece (the budget op writes the rows itself, after
    attending over the cache as it was): -> (h, q, q_sink, k, v)."""
    h = layer_tail(h, o, wo, ln2, wgu, wd, shape=shape)
    return (h, *layer_head(h, ln1, wqkv, bqkv, qn, kn, cos, sin, cos_s, sin_s, shape=shape))


def budget_logits(w: PackedDecoder, ids, positions, window, pages, keys, values, bounds, *, splits: int, k_max: int,
                  page: int, first=layer_head, link=budget_link, tail=layer_tail):
    """decode_logits with the attention budget: pages [] int64 (k, at most k_max); bounds: per layer
    [B', H_kv, P, 2 or 3, D]. Writes each stream's new row and its page's bounds; returns logits [B, V]."""
    import edgeattn.plugins.kernels.ring_ops  # noqa: F401  (registers the ops)

    F, s, t = torch.nn.functional, w.shape, w.t
    wl = torch.where((window <= 0) | (window > s.window_max) | (pages > 0), s.window_max, window)  # the sinks' span
    cos, sin = _angles(torch, w.inv_freq, positions, w.rope_scaling, w.dtype)
    cos_s, sin_s = _angles(torch, w.inv_freq, torch.minimum(positions, s.sinks + wl), w.rope_scaling, w.dtype)
    h = F.embedding(ids, t["embed"])  # h: [B, hidden]
    q, q_s, k, v = first(h, t["ln1"][0], t["wqkv"][0], t["bqkv"][0], t["qn"][0], t["kn"][0], cos, sin, cos_s, sin_s,
                         shape=s)
    for i in range(s.layers):
        o = torch.ops.edgeattn.ring_decode_budget(q, q_s, k, v, keys[i], values[i], bounds[i], positions, window,
                                                  pages, s.sinks, s.scale, splits, page, k_max)
        if i + 1 == s.layers:
            h = tail(h, o, t["wo"][i], t["ln2"][i], t["wgu"][i], t["wd"][i], shape=s)
            break
        j = i + 1
        h, q, q_s, k, v = link(h, o, t["wo"][i], t["ln2"][i], t["wgu"][i], t["wd"][i], t["ln1"][j], t["wqkv"][j],
                               t["bqkv"][j], t["qn"][j], t["kn"][j], cos, sin, cos_s, sin_s, shape=s)
    return F.linear(_rms_norm(torch, h, t["norm"], s.eps), t["lm_head"])


class BudgetGraph(DecodeGraph):
    """A decode step with the budget for the first `batch` streams, captured once; `pages` is a device scalar
    (any k up to k_max replays the same graph). `compile`: "none", else the pieces around attention compiled
    (the first head, a tail + head link, the last tail)."""

    def __init__(self, weights: PackedDecoder, keys, values, bounds, *, batch: int, splits: int, k_max: int,
                 page: int, compile: str = "linked", greedy: bool = True, sampling=None) -> None:
        super().__init__(weights, keys, values, batch=batch, splits=splits, compile="none", greedy=greedy,
                         sampling=sampling)
        self.bounds, self.k_max, self.page = bounds, int(k_max), int(page)
        self.pages = torch.zeros((), dtype=torch.int64, device=weights.device)
        if compile != "none":
            self._pieces = {"first": _compiled(torch, layer_head), "link": _compiled(torch, budget_link),
                            "tail": _compiled(torch, layer_tail)}
        step = self._fn  # decode_greedy, decode_logits or a sampled step: they take the logits function
        self._fn = self._logits if step is decode_logits else (
            lambda *args, **pieces: step(*args, _logits=self._logits, **pieces))

    def _logits(self, w, ids, positions, window, keys, values, splits=0, **pieces):
        return budget_logits(w, ids, positions, window, self.pages, keys, values, self.bounds, splits=splits,
                             k_max=self.k_max, page=self.page, **pieces)

    def __call__(self, ids, positions, window, pages: int = 0):
        self.pages.fill_(int(pages))
        return super().__call__(ids, positions, window)


class BoundsGraph(DecodeGraph):
    """Today's decode step (k = 0, bit for bit) followed by the bounds of the pages it wrote, in one graph."""

    def __init__(self, weights: PackedDecoder, keys, values, bounds, *, page: int, **kw) -> None:
        super().__init__(weights, keys, values, **kw)
        self.bounds, self.page = bounds, int(page)

    def _run(self):
        out = super()._run()
        refresh_pages(self.keys, self.bounds, self.positions, 1, sinks=self.weights.shape.sinks, page=self.page)
        return out

    def __call__(self, ids, positions, window, pages: int = 0):
        return super().__call__(ids, positions, window)


def refresh_pages(keys, bounds, starts, count: int, *, sinks: int, page: int) -> None:
    """In every layer, the bounds of the pages that `count` rows written from starts[i] (streams 0..len-1) touched."""
    if keys[0].device.type == "cuda":
        from edgeattn.plugins.kernels.budget_bounds import refresh_bounds as refresh
    else:
        from edgeattn.plugins.kernels.ring_ops import refresh_bounds_reference as refresh
    for k_cache, b in zip(keys, bounds):
        refresh(k_cache, b, starts, count, sinks=sinks, page=page)


# --- the backend's checks ------------------------------------------------------------------------------------------
def check_pages(decoder, pages) -> int:
    """Retrieval pages k as an int: 0 to the ring's pages (window_max / page), else ConfigError."""
    if isinstance(pages, bool) or not isinstance(pages, (int, np.integer)) or int(pages) < 0:
        raise ConfigError(f"pages: expected an integer >= 0, found {pages!r}")
    if pages and not decoder.page:
        raise ConfigError(f"attention budget: expected a ring cut into pages of {DEFAULT_PAGE} rows, found a ring of "
                          f"{decoder.layout.window_max}: run it with pages 0 (a window)")
    count = decoder.layout.window_max // max(decoder.page, 1)
    if int(pages) > count:
        raise ConfigError(f"pages: expected 0 to {count} (the ring's pages of {decoder.page} rows), found {int(pages)}")
    if pages and decoder.weights.t.get("kv_scale") is not None:
        raise ConfigError("attention budget: expected a bf16/fp16 cache, found an FP8 cache (it keeps no page "
                          "bounds): run it with pages 0 (a window)")
    return int(pages)


def check_budget(decoder, budget):
    """A budget the decoder runs as given (window, pages, and its page size), else ConfigError."""
    decoder.check_window(budget.window)
    if check_pages(decoder, budget.pages) and budget.page != decoder.page:
        raise ConfigError(f"attention budget: expected pages of {decoder.page} rows, found {budget.page}")
    return budget


# --- the cache's bounds --------------------------------------------------------------------------------------------
def attach_bounds(cache, weights: PackedDecoder, page: int = DEFAULT_PAGE) -> list | None:
    """The cache's page bounds (per layer [streams, H_kv, P, BOUND_SLOTS, D]), made from its rows the first time."""
    if getattr(cache, "bounds", None) is not None:
        return cache.bounds
    s = weights.shape
    page = cache.layout.check_page(page)
    if weights.t.get("kv_scale") is not None:
        raise ConfigError("attention budget: expected a bf16/fp16 cache, found an FP8 cache (no page bounds for it)")
    size = (cache.streams, s.kv_heads, s.window_max // page, BOUND_SLOTS, s.head_dim)
    cache.bounds = [torch.zeros(size, dtype=cache.keys[0].dtype, device=weights.device) for _ in range(s.layers)]
    cache.page = page
    ends = torch.as_tensor(cache.positions, device=weights.device)
    refresh_pages(cache.keys, cache.bounds, ends - s.capacity, s.capacity, sinks=s.sinks, page=page)  # every page
    return cache.bounds


def move_bounds(cache, src: int, dst: int) -> None:
    """CudaCache.move's part for the bounds (called before the positions move)."""
    for b in getattr(cache, "bounds", None) or ():
        b[dst] = b[src]


def swap_bounds(cache, a: int, b: int) -> None:
    for layer in getattr(cache, "bounds", None) or ():
        layer[[a, b]] = layer[[b, a]]


# --- the backend's steps -------------------------------------------------------------------------------------------
def decode(decoder, cache, n: int, ids, window: int, pages: int, sampling):
    """CudaDecoder._decode with the budget: a BudgetGraph (k > 0) or a BoundsGraph (k = 0) for the bucket."""
    from edgeattn.plugins.kernels.budget_decode import budget_splits, k_max_for
    from edgeattn.plugins.kernels.cached_decode import cached_decode_splits

    s = decoder.weights.shape
    bounds = attach_bounds(cache, decoder.weights)
    bucket = min(1 << (n - 1).bit_length(), cache.streams)
    live = decoder.layout.live_window(window)
    longest = int(cache.positions[:n].max()) + 1
    keys = min(live, max(longest - s.sinks, 1))
    keys = min(1 << (keys - 1).bit_length(), live)
    kind = "logits" if sampling is None else "greedy" if isinstance(sampling, str) else "sampled"
    common = dict(batch=bucket, greedy=kind == "greedy",
                  sampling=sampling.rows(0, bucket) if kind == "sampled" else None)
    cuda = decoder.weights.device.type == "cuda"
    if pages:
        k_max = k_max_for(pages)
        splits = budget_splits(bucket * s.kv_heads, s.sinks, keys, k_max, cache.page, decoder._sms)
        key = (bucket, splits, kind, "budget", k_max)
        make = lambda: BudgetGraph(decoder.weights, cache.keys, cache.values, bounds, splits=splits,  # noqa: E731
                                   k_max=k_max, page=cache.page, compile=decoder.compile if cuda else "none", **common)
    else:
        splits = cached_decode_splits(bucket * s.kv_heads, s.sinks, keys, decoder._sms)
        key = (bucket, splits, kind, "bounds")
        make = lambda: BoundsGraph(decoder.weights, cache.keys, cache.values, bounds, page=cache.page,  # noqa: E731
                                   splits=splits, compile=decoder.compile if cuda else "none", **common)
    graphs = decoder.graphs_of(cache)
    graph = graphs.get(key)
    if graph is None:
        graph = graphs[key] = make()
    inputs = np.zeros((2, bucket), dtype=np.int64)
    inputs[0, :n] = ids
    inputs[1] = cache.positions[:bucket]
    inputs = torch.from_numpy(inputs).to(decoder.weights.device, non_blocking=True)
    with torch.no_grad():
        out = graph(inputs[0], inputs[1], window, pages)
    return out[:n]


def prefill_logits(w: PackedDecoder, ids, start: int, window: int, pages: int, keys, values, bounds, row: int, *,
                   page: int, last_only: bool = True):
    """A prefill chunk of one stream with the budget (eager, the op's PyTorch form): ids [S] at positions
    start .. start + S - 1 of cache row `row`; each query reads the sinks, its window and its k best pages of the
    cache as it was before the chunk, then the chunk's rows and their pages' bounds are written. -> logits."""
    from edgeattn.attention.cached_torch import cached_windowed_attention
    from edgeattn.plugins.kernels.ring_ops import refresh_bounds_reference

    F, s, t = torch.nn.functional, w.shape, w.t
    n, dev = ids.shape[0], ids.device
    live = s.window_max if window <= 0 or window > s.window_max or pages > 0 else int(window)  # the sinks' span
    positions = torch.arange(start, start + n, device=dev)
    cos, sin = _angles(torch, w.inv_freq, positions, w.rope_scaling, w.dtype)
    cos_s, sin_s = _angles(torch, w.inv_freq, torch.clamp(positions, max=s.sinks + live), w.rope_scaling, w.dtype)
    rows = torch.where(positions < s.sinks, positions, s.sinks + torch.remainder(positions - s.sinks, s.window_max))
    first = torch.tensor([start], device=dev)
    h = F.embedding(ids, t["embed"])
    for i in range(s.layers):
        q, q_s, k, v = layer_head(h, t["ln1"][i], t["wqkv"][i], t["bqkv"][i], t["qn"][i], t["kn"][i], cos, sin,
                                  cos_s, sin_s, shape=s)  # q: [S, H, D]; k, v: [S, H_kv, D]
        kc, vc, bc = keys[i][row:row + 1], values[i][row:row + 1], bounds[i][row:row + 1]
        kh, vh = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, H_kv, S, D]
        o = cached_windowed_attention(q.transpose(0, 1)[None], q_s.transpose(0, 1)[None], kh, vh, kc, vc, first,
                                      torch.tensor(window, device=dev), torch.tensor(pages, device=dev),
                                      bc[:, :, :, :2], sinks=s.sinks, scale=s.scale)  # the op's min and max
        kc[0][:, rows] = kh[0].to(kc.dtype)
        vc[0][:, rows] = vh[0].to(vc.dtype)
        if dev.type == "cuda":
            from edgeattn.plugins.kernels.budget_bounds import refresh_bounds

            refresh_bounds(kc, bc, first, n, sinks=s.sinks, page=page)
        else:
            refresh_bounds_reference(kc, bc, first, n, sinks=s.sinks, page=page)
        h = layer_tail(h, o[0].transpose(0, 1), t["wo"][i], t["ln2"][i], t["wgu"][i], t["wd"][i], shape=s)
    if last_only:
        h = h[-1:]
    return F.linear(_rms_norm(torch, h, t["norm"], s.eps), t["lm_head"])


def prefill(decoder, cache, streams, ids, lengths, window: int, pages: int, last_only: bool, plain):
    """CudaDecoder._prefill when the cache holds bounds: k > 0 runs each chunk through prefill_logits; k = 0 runs
    `plain` (the backend's prefill, unchanged) and then refreshes the written pages' bounds."""
    w = decoder.weights
    s = w.shape
    bounds = attach_bounds(cache, w)
    starts = [int(cache.positions[r]) for r in streams]
    if not pages:
        out = plain()
        for r, start, count in zip(streams, starts, lengths):
            refresh_pages([k[r:r + 1] for k in cache.keys], [b[r:r + 1] for b in bounds],
                          torch.tensor([start], device=w.device), count, sinks=s.sinks, page=cache.page)
        return out
    ids = torch.as_tensor(ids, device=w.device)
    out, at = [], 0
    with torch.no_grad():
        for r, start, count in zip(streams, starts, lengths):
            out.append(prefill_logits(w, ids[at:at + count], start, window, pages, cache.keys, cache.values, bounds, r,
                                      page=cache.page, last_only=last_only))
            at += count
    return torch.cat(out)


__all__ = ["BoundsGraph", "BudgetGraph", "attach_bounds", "budget_logits", "check_budget", "check_pages", "decode",
           "move_bounds", "prefill", "prefill_logits", "refresh_pages", "swap_bounds"]
