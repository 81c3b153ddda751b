"""Tile and kernel choices for the windowed-attention kernels: the tables the H200 sweeps filled.

No Triton here: the tables and their lookups are plain data, read by the launch wrappers
(`dispatch.windowed_prefill`, `decode.windowed_decode`), the AOT builds (`aot.py`) and the benchmark.
A tile is (BLOCK_M, BLOCK_N, num_warps, num_stages).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeattn.errors import ConfigError

# Default prefill tile per (arch base, head dim): see `arch_base` for which archs share a row. sm_90: the
# winners of the first H200 tile sweep in benchmarks/attention_h200.py (docs/kernels.md; 64x64 tiles
# waste the least work at the window's edges and tied the larger tiles at full window). sm_87 / sm_110:
# not measured; conservative (Orin has 164 KiB of shared memory per SM, like sm_80).
PREFILL_TILES: dict[tuple[int, int], tuple[int, int, int, int]] = {
    (90, 64): (64, 64, 4, 3),
    (90, 128): (64, 64, 4, 3),
    (87, 64): (64, 64, 4, 3),
    (87, 128): (64, 64, 4, 2),
    (110, 64): (64, 64, 4, 3),
    (110, 128): (64, 64, 4, 3),
}
# Whether the default prefill kernel (prefill._windowed_fwd_kernel) loads K/V through in-kernel Hopper
# tensor descriptors (TMA) when the caller passes no `use_tma`: off, it lost to plain loads in the first
# H200 sweep. AOT builds never use it (a TensorRT launch gives no scratch allocator; sm_87 has no TMA).
PREFILL_TMA: dict[int, bool] = {90: False}
# The prefill kernel `windowed_prefill` runs on CUDA when the caller passes neither `hopper` nor
# `use_tma` and no PREFILL_WINDOW_TABLE row applies: None = the default kernel (prefill.py), else
# HopperVariant fields for the sm_90 kernel (prefill_hopper.py). H200 sweeps 2026-11-29: descriptors were
# 1.0-1.1x the default kernel on every window.
PREFILL_HOPPER: dict[int, dict | None] = {90: {"desc": True}}
# Per-window choices when the caller knows the window on the host (windowed_prefill(..., window_hint=W)):
# (arch base, head dim) -> [(largest window the row serves, 0 = any incl. full; tile; HopperVariant
# fields, or None = the default kernel)], smallest window first. No row (other archs, head dim 256): the
# default tile and kernel above apply.
PREFILL_WINDOW_TABLE: dict[tuple[int, int], list[tuple[int, tuple[int, int, int, int], dict | None]]] = {
    # second H200 sweep, 2026-11-29 (benchmarks/results/attention_h200_sweep2_2026-11-29.log)
    (90, 64): [(256, (64, 64, 4, 2), {"desc": True}), (1024, (64, 64, 4, 2), {"desc": True, "loop_stages": 2}),
               (0, (64, 128, 4, 3), {"desc": True})],
    # D = 128: prefill sweeps of 2026-12-01 (benchmarks/results/generation_h200_prefill_sweep*_2026-12-01.json,
    # B = 2, H = 32, S = 8192, 4 sinks): the narrow sink block at every window
    (90, 128): [(256, (64, 32, 4, 2), {"desc": True, "sink_block": True}),
                (1024, (64, 64, 4, 3), {"desc": True, "sink_block": True}),
                (0, (128, 128, 8, 3), {"desc": True, "sink_block": True})],
}
DECODE_BLOCK_N = 64  # keys per block of the split-K decode kernel
DECODE_MAX_QUERIES = 16  # windowed_attention takes the decode path for S_q at or below this ...
DECODE_MAX_GROUP_ROWS = 64  # ... and (H / H_kv) * S_q at or below this (the decode kernel's BLOCK_M rows)
DEFAULT_SMS = 132  # streaming multiprocessors of an H100 / H200 SXM: decode_splits' default wave


def arch_base(arch: int) -> int:
    """The table row an arch reads: 110 (Thor) as itself, 90 and newer as 90, older (87, 89, ...) as 87."""
    return 90 if arch >= 90 and arch != 110 else (110 if arch == 110 else 87)


def prefill_tile(arch: int, head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for an arch (e.g. 90) and head dim."""
    bm, bn, warps, stages = PREFILL_TILES[(arch_base(arch), 64 if head_dim <= 64 else 128)]
    if head_dim > 128:  # 256: 64x32 tiles and 2 stages, to fit shared memory
        bm, bn, stages = 64, 32, 2
    return bm, bn, warps, stages


@dataclass(frozen=True)
class HopperVariant:
    """Options of the sm_90 prefill kernel (prefill_hopper.py; the sm_90 CUDA default per PREFILL_HOPPER).

    desc: host-built TMA tensor descriptors for Q, K, V (sm_90+, 16-byte aligned strides; otherwise plain
    loads, with a warning saying why). fold_scale: pre-scale q by scale / ln 2. loop_stages: software
    pipeline depth of the unmasked band loop (None: the tile's num_stages). warp_specialize: the band loop
    as `tl.range(..., warp_specialize=True)` (Triton >= 3.4 on Hopper/Blackwell). sink_block: the sinks left of
    the window as one narrow block (16 keys for up to 16 sinks) with a per-key mask, not a whole masked
    BLOCK_N block (prefill_hopper.sink_block_keys). one_loop: the band and the edge blocks in one pipelined
    loop (one prologue; masks chosen per block) instead of two loops. split_edges: with one_loop, causal, no
    padding: the right-edge (diagonal) blocks are masked by the causal test alone, not the full window test
    (ignored without one_loop: as a branch in the two-loop kernel's edge loop it broke Triton 3.6's pipeliner).
    persistent: programs per SM of the persistent kernel (prefill_persistent.py: causal, no padding; one loop
    over every (tile, key block) step of a program's tiles; 0: one program per tile, this kernel);
    edge_masks: there, mask only the blocks crossing a window edge or the diagonal. rcp_epilogue: the epilogue
    multiplies by one reciprocal per row instead of dividing every element. tma_store: (with desc) the output
    tile leaves through a tensor descriptor (an asynchronous bulk store).
    """

    desc: bool = False
    fold_scale: bool = False
    loop_stages: int | None = None
    warp_specialize: bool = False
    sink_block: bool = False
    split_edges: bool = False
    one_loop: bool = False
    persistent: int = 0
    edge_masks: bool = False
    rcp_epilogue: bool = False
    tma_store: bool = False

    def __post_init__(self):
        if self.loop_stages is not None and not 1 <= self.loop_stages <= 6:
            raise ConfigError(f"loop_stages: expected None or 1..6, found {self.loop_stages}")
        if not 0 <= self.persistent <= 8:
            raise ConfigError(f"persistent: expected 0 (off) or 1..8 programs per SM, found {self.persistent}")

    @property
    def name(self) -> str:
        parts = ["desc" if self.desc else "ptr"] + (["fold"] if self.fold_scale else [])
        parts += [f"ls{self.loop_stages}"] if self.loop_stages else []
        parts += (["ws"] if self.warp_specialize else []) + (["sink"] if self.sink_block else [])
        parts += (["split"] if self.split_edges else []) + (["one"] if self.one_loop else [])
        parts += [f"pers{self.persistent}"] if self.persistent else []
        parts += (["edges"] if self.edge_masks else []) + (["rcp"] if self.rcp_epilogue else [])
        return "+".join(parts + (["tstore"] if self.tma_store else []))


def window_row(arch: int, head_dim: int, window_hint: int | None):
    """The PREFILL_WINDOW_TABLE row serving this window (0 / None: full), or None."""
    w = int(window_hint or 0)
    rows = PREFILL_WINDOW_TABLE.get((arch_base(arch), 64 if head_dim <= 64 else 128), []) if head_dim <= 128 else []
    for row in rows:
        if row[0] == 0 or (0 < w <= row[0]):
            return row
    return None


def prefill_config_for_window(arch: int, head_dim: int, window_hint: int | None):
    """(tile, HopperVariant or None) for a window known on the host (0 / None: full), from
    PREFILL_WINDOW_TABLE; falls back to (prefill_tile(arch, head_dim), None)."""
    row = window_row(arch, head_dim, window_hint)
    if row is None:
        return prefill_tile(arch, head_dim), None
    return tuple(row[1]), (HopperVariant(**row[2]) if row[2] is not None else None)


def prefill_tile_for_window(arch: int, head_dim: int, window_hint: int | None) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for a known window (PREFILL_WINDOW_TABLE, else prefill_tile)."""
    return prefill_config_for_window(arch, head_dim, window_hint)[0]


def decode_splits(batch_kv_heads: int, s_k: int, sms: int = DEFAULT_SMS) -> int:
    """Splits per kv head so that the grid fills one wave of programs: a power of two, capped by the
    key blocks and at 128."""
    want = max(1, -(-sms // batch_kv_heads))
    blocks = max(1, -(-s_k // DECODE_BLOCK_N))
    return min(1 << (want - 1).bit_length(), 1 << (blocks - 1).bit_length(), 128)


__all__ = ["DECODE_BLOCK_N", "DECODE_MAX_GROUP_ROWS", "DECODE_MAX_QUERIES", "DEFAULT_SMS", "HopperVariant",
           "PREFILL_HOPPER", "PREFILL_TILES", "PREFILL_TMA", "PREFILL_WINDOW_TABLE", "arch_base", "decode_splits",
           "prefill_config_for_window", "prefill_tile", "prefill_tile_for_window", "window_row"]
