"""Which kernel runs: `windowed_attention` (prefill or decode) and `windowed_prefill` (the default prefill
kernel or the sm_90 one, and the tile), from the tables in tuning.py.

`windowed_attention` is edgeattn::WindowedAttention on CUDA (the torch op's CUDA kernel) or on CPU
tensors under TRITON_INTERPRET=1; it checks its inputs here, once, before any kernel runs.
"""

from __future__ import annotations

from edgeattn.errors import InputError
from edgeattn.plugins.kernels import decode, prefill, prefill_hopper, tuning
from edgeattn.plugins.kernels.launch import device_arch
from edgeattn.plugins.kernels.tuning import HopperVariant


def windowed_prefill(q, k, v, window, *, sinks=0, causal=True, scale=0.0, key_padding_mask=None,
                     tile: tuple[int, int, int, int] | None = None, use_tma: bool | None = None,
                     one_loop: bool = True, hopper: HopperVariant | dict | str | None = "auto",
                     window_hint: int | None = None):
    """Prefill / encoder path. q: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D]; window: int tensor [].

    tile: (BLOCK_M, BLOCK_N, num_warps, num_stages); default from the tables (tuning.py).
    use_tma: the default kernel loads K/V with in-kernel Hopper tensor descriptors (sm_90+; default per
    PREFILL_TMA). one_loop: one pipelined loop over all key blocks (default) rather than one loop per region.
    hopper: run the sm_90 kernel (prefill_hopper.py) with these options (a HopperVariant or its fields as
    a dict); use_tma / one_loop do not apply to it. None: the default kernel. "auto": PREFILL_HOPPER[arch]
    on CUDA when use_tma is not given, else the default kernel.
    window_hint: the window's value when the host knows it (>= S_k: full): picks tile (and kernel, unless
    `hopper` is given) from PREFILL_WINDOW_TABLE when `tile` is None. The kernel still reads `window`.
    """
    d, s_k = q.shape[3], k.shape[2]
    arch = device_arch(q.device)
    hint = window_hint if window_hint is None or window_hint < s_k else 0
    if tile is None and window_hint is not None and tuning.window_row(arch, d, hint):
        tile, hinted = tuning.prefill_config_for_window(arch, d, hint)
        hopper = hinted if isinstance(hopper, str) else hopper
    if isinstance(hopper, str):
        if hopper != "auto":
            raise InputError(f"hopper: expected a HopperVariant, a dict, None or 'auto', found {hopper!r}")
        hopper = tuning.PREFILL_HOPPER.get(arch) if q.is_cuda and use_tma is None else None
    tile = tuple(tile or tuning.prefill_tile(arch, d))
    if hopper is not None:
        variant = hopper if isinstance(hopper, HopperVariant) else HopperVariant(**hopper)
        return prefill_hopper.hopper_prefill(q, k, v, window, sinks=sinks, causal=causal, scale=scale,
                                             key_padding_mask=key_padding_mask, tile=tile, variant=variant,
                                             arch=arch)
    if use_tma is None:
        use_tma = tuning.PREFILL_TMA.get(arch, False) and q.is_cuda
    return prefill.default_prefill(q, k, v, window, sinks=sinks, causal=causal, scale=scale,
                                   key_padding_mask=key_padding_mask, tile=tile, use_tma=use_tma, one_loop=one_loop)


def check_inputs(q, k, v, window, key_padding_mask) -> None:
    """InputError unless q, k, v, window and the padding mask are what the kernels accept."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise InputError(f"q, k, v: expected 4-D [B, H, S, D], found {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, h, s_q, d = q.shape
    _, h_kv, s_k, _ = k.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise InputError(f"k, v: expected [B={b}, H_kv, S_k, D={d}] alike, found {tuple(k.shape)}, {tuple(v.shape)}")
    if h % h_kv:
        raise InputError(f"heads: expected H % H_kv == 0, found H={h}, H_kv={h_kv}")
    if s_q > s_k:
        raise InputError(f"S_q: expected <= S_k={s_k} (queries are the last S_q positions), found {s_q}")
    if d not in (16, 32, 64, 128, 256):
        raise InputError(f"head dim: expected one of 16, 32, 64, 128, 256, found {d}")
    import torch

    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise InputError(f"dtype: expected q, k, v all fp16 or bf16, found {q.dtype}, {k.dtype}, {v.dtype}")
    if window.numel() != 1 or window.dtype.is_floating_point:
        raise InputError(f"window: expected an integer scalar tensor, found {window.dtype} {tuple(window.shape)}")
    if window.device != q.device:
        raise InputError(f"window: expected on {q.device} (read inside the kernel), found {window.device}")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (b, s_k):
        raise InputError(f"key_padding_mask: expected [B={b}, S_k={s_k}], found {tuple(key_padding_mask.shape)}")


def windowed_attention(q, k, v, window, *, sinks: int = 0, causal: bool = True, scale: float = 0.0,
                       key_padding_mask=None, window_hint: int | None = None):
    """edgeattn::WindowedAttention on CUDA (or CPU under TRITON_INTERPRET=1).

    q: [B, H, S_q, D]; k, v: [B, H_kv, S_k, D] (fp16/bf16); window: integer scalar tensor on q's device
    (0, negative or >= S_k: full). Returns [B, H, S_q, D]. S_q <= DECODE_MAX_QUERIES (16) with
    (H / H_kv) * S_q <= DECODE_MAX_GROUP_ROWS (64) takes the split-K decode kernels, the rest prefill.
    """
    check_inputs(q, k, v, window, key_padding_mask)
    if sinks < 0:
        raise InputError(f"sinks: expected >= 0, found {sinks}")
    group_rows = (q.shape[1] // k.shape[1]) * q.shape[2]
    use_decode = q.shape[2] <= tuning.DECODE_MAX_QUERIES and group_rows <= tuning.DECODE_MAX_GROUP_ROWS
    path = decode.windowed_decode if use_decode else windowed_prefill
    return path(q, k, v, window, sinks=sinks, causal=causal, scale=scale, key_padding_mask=key_padding_mask,
                window_hint=window_hint)


__all__ = ["check_inputs", "windowed_attention", "windowed_prefill"]
