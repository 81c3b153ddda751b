"""`torch.ops.edgeattn.ring_decode`: one decode token per stream over a sinks + ring KV cache, as a torch op.

Importing this module registers the op (once). Schema:

    edgeattn::ring_decode(Tensor q, Tensor q_sink, Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache,
                          Tensor positions, Tensor window, int sinks, float scale, int splits) -> Tensor

q, q_sink: [B, H, D] (the query rotated at t, and at min(t, sinks + W) for the sink rows); k, v: [B, H_kv, D],
the new token's key (rotated at t) and value; k_cache, v_cache: [B', H_kv, C, D] with B' >= B (streams 0..B-1);
positions: [B] int64, the tokens each stream holds before this one; window: [] int64 on the device (0: the
whole ring). The op writes the new row of each stream (edgeattn.attention.ring's geometry) and returns the
attention output [B, H, D]. CUDA runs the split-K Triton kernel (cached_decode.py) with `splits` programs per
kv head (0: sized from the ring); other devices run the float reference, so tests run anywhere. A fake kernel
makes it traceable by torch.compile, which keeps the cache writes in place (the op declares them).

`ring_decode_budget` is ring_decode with the attention budget (also the pages [] int64 device scalar, the
page bounds [B', H_kv, P, 2 or 3, D] it keeps, `page` and `k_max`): CUDA runs budget_decode.py's selection and
block-sparse split-K kernels over the cache as it was before the new token, the attention launch writing the new
row and its page's bounds once the row it overwrites is read.
"""

from __future__ import annotations

from edgeattn.optional import require

torch = require("torch", "the edgeattn ring decode op")

from edgeattn.attention.cached_torch import cached_windowed_attention  # noqa: E402  (after the torch check)

OP_NAME = "edgeattn::ring_decode"


def _write_rows(k, v, k_cache, v_cache, positions, sinks: int) -> None:
    b = k.shape[0]
    rows = _rows(positions, sinks, k_cache.shape[2] - sinks)  # rows: [B]
    streams = torch.arange(b, device=k.device)
    k_cache[streams, :, rows] = k.to(k_cache.dtype)  # advanced indices around a slice: [B, H_kv, D]
    v_cache[streams, :, rows] = v.to(v_cache.dtype)


@torch.library.custom_op(OP_NAME, mutates_args=("k_cache", "v_cache"))
def ring_decode(q: torch.Tensor, q_sink: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, positions: torch.Tensor, window: torch.Tensor, sinks: int, scale: float,
                splits: int) -> torch.Tensor:
    """Reference for non-CUDA devices: attends in float32 over the past rows and the new key (reads the window
    on the host), then writes the rows."""
    b = q.shape[0]
    out = cached_windowed_attention(q[:, :, None].float(), q_sink[:, :, None].float(), k[:, :, None].float(),
                                    v[:, :, None].float(), k_cache[:b].float(), v_cache[:b].float(), positions,
                                    window, sinks=sinks, scale=scale)
    _write_rows(k, v, k_cache, v_cache, positions, sinks)
    return out[:, :, 0].to(q.dtype)


@ring_decode.register_kernel("cuda")
def _ring_decode_cuda(q, q_sink, k, v, k_cache, v_cache, positions, window, sinks, scale, splits):
    from edgeattn.plugins.kernels.cached_decode import cached_decode  # loads triton

    _write_rows(k, v, k_cache, v_cache, positions, sinks)
    b = q.shape[0]
    out = cached_decode(q[:, :, None], q_sink[:, :, None], k_cache[:b], v_cache[:b], positions, window,
                        sinks=sinks, scale=scale, splits=splits or None)
    return out[:, :, 0]


@ring_decode.register_fake
def _ring_decode_fake(q, q_sink, k, v, k_cache, v_cache, positions, window, sinks, scale, splits):
    return torch.empty_like(q)


ATTEND_NAME = "edgeattn::ring_attend"


@torch.library.custom_op(ATTEND_NAME, mutates_args=())
def ring_attend(q: torch.Tensor, q_sink: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                positions: torch.Tensor, window: torch.Tensor, sinks: int, scale: float, splits: int) -> torch.Tensor:
    """ring_decode's attention alone, for a caller that already wrote the new rows (the cuda step writes them in
    the compiled piece that computes them). Reference for non-CUDA devices."""
    b = q.shape[0]
    rows = _rows(positions, sinks, k_cache.shape[2] - sinks)
    streams = torch.arange(b, device=q.device)
    k, v = k_cache[streams, :, rows], v_cache[streams, :, rows]  # the new rows, [B, H_kv, D]
    # the new rows already in the cache are never read as past rows: a wrapped ring's row at slot(t) held
    # position t - W_max, at distance W_max, outside any window
    out = cached_windowed_attention(q[:, :, None].float(), q_sink[:, :, None].float(), k[:, :, None].float(),
                                    v[:, :, None].float(), k_cache[:b].float(), v_cache[:b].float(), positions, window,
                                    sinks=sinks, scale=scale)
    return out[:, :, 0].to(q.dtype)


@ring_attend.register_kernel("cuda")
def _ring_attend_cuda(q, q_sink, k_cache, v_cache, positions, window, sinks, scale, splits):
    from edgeattn.plugins.kernels.cached_decode import cached_decode

    b = q.shape[0]
    out = cached_decode(q[:, :, None], q_sink[:, :, None], k_cache[:b], v_cache[:b], positions, window,
                        sinks=sinks, scale=scale, splits=splits or None)
    return out[:, :, 0]


@ring_attend.register_fake
def _ring_attend_fake(q, q_sink, k_cache, v_cache, positions, window, sinks, scale, splits):
    return torch.empty_like(q)


BUDGET_NAME = "edgeattn::ring_decode_budget"


@torch.library.custom_op(BUDGET_NAME, mutates_args=("k_cache", "v_cache", "bounds"))
def ring_decode_budget(q: torch.Tensor, q_sink: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, bounds: torch.Tensor, positions: torch.Tensor,
                       window: torch.Tensor, pages: torch.Tensor, sinks: int, scale: float, splits: int, page: int,
                       k_max: int) -> torch.Tensor:
    """ring_decode with the attention budget (docs/windowed-attention.md): the sinks, the window and the
    `pages` (a [] int64 device scalar, at most k_max) best pages of `page` ring rows by their key bounds
    (bounds: [B', H_kv, P, 2 or 3, D]: min, max and optionally min + max, kept by this op). Attends over the cache as it was before the new token, then
    writes the new row and recomputes its page's bounds. Reference for non-CUDA devices (float32)."""
    b = q.shape[0]
    k_eff = torch.clamp(pages, max=k_max)
    out = cached_windowed_attention(q[:, :, None].float(), q_sink[:, :, None].float(), k[:, :, None].float(),
                                    v[:, :, None].float(), k_cache[:b].float(), v_cache[:b].float(), positions,
                                    window, k_eff, bounds[:b, :, :, :2].float(), sinks=sinks, scale=scale)
    _write_rows(k, v, k_cache, v_cache, positions, sinks)
    refresh_bounds_reference(k_cache, bounds, positions, 1, sinks=sinks, page=page)
    return out[:, :, 0].to(q.dtype)


@ring_decode_budget.register_kernel("cuda")
def _ring_decode_budget_cuda(q, q_sink, k, v, k_cache, v_cache, bounds, positions, window, pages, sinks, scale,
                             splits, page, k_max):
    from edgeattn.plugins.kernels.budget_decode import budget_decode  # loads triton

    # two launches: the selection, then the attention, whose last program per stream and kv head writes the row
    # and its page's bounds (EDGEATTN_BUDGET_V1=1: the first path, ending in budget_bounds.ring_write_bounds)
    return budget_decode(q, q_sink, k, v, k_cache, v_cache, bounds, positions, window, pages, sinks=sinks,
                         page=page, k_max=k_max, scale=scale, splits=splits or None, write=True)


@ring_decode_budget.register_fake
def _ring_decode_budget_fake(q, q_sink, k, v, k_cache, v_cache, bounds, positions, window, pages, sinks, scale,
                             splits, page, k_max):
    return torch.empty_like(q)


def refresh_bounds_reference(k_cache, bounds, positions, count: int, *, sinks: int, page: int) -> None:
    """budget_bounds.refresh_bounds in plain PyTorch (any device, slow): the pages that `count` rows written from
    positions[b] touched, recomputed from their filled rows; in place."""
    wmax = k_cache.shape[2] - sinks
    for b, start in enumerate(positions.tolist()):
        end = start + int(count)
        first = max(start, sinks)
        if end <= first:
            continue  # sink rows only: in no page
        offsets = torch.arange(first, end, device=k_cache.device)[-wmax:] - sinks
        filled = min(end - sinks, wmax)
        for j in torch.unique(torch.remainder(offsets, wmax) // page).tolist():
            rows = k_cache[b, :, sinks + j * page: sinks + min((j + 1) * page, filled)]  # [H_kv, n, D]
            bounds[b, :, j, 0] = rows.amin(dim=1)
            bounds[b, :, j, 1] = rows.amax(dim=1)
            if bounds.shape[3] == 3:  # the sum the selection reads, from the stored min and max, rounded once
                bounds[b, :, j, 2] = (bounds[b, :, j, 0].float() + bounds[b, :, j, 1].float()).to(bounds.dtype)


def _rows(positions, sinks: int, wmax: int):
    p = positions.to(torch.int64)
    return torch.where(p < sinks, p, sinks + torch.remainder(p - sinks, wmax))


__all__ = ["ATTEND_NAME", "BUDGET_NAME", "OP_NAME", "refresh_bounds_reference", "ring_attend", "ring_decode",
           "ring_decode_budget"]
