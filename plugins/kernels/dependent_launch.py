"""Programmatic dependent launch (Hopper and newer): a kernel of the decode step starts while the one before it
finishes, fetches the weights it will read (which no kernel writes) into L2, and only then waits for the kernel
before it to complete and flush its writes.

A step of a few streams is a chain of ~150 short kernels, each waiting on launch latency and the first loads of
its weights more than on bandwidth; letting the next kernel's launch and weight fetch overlap the current
kernel's tail takes those waits off the critical path. The device side, at the top of each kernel of the chain:
`prefetch_l2` of its weight rows, then `dependent_start` (wait for the previous kernel, then allow the next one
to launch); the host side:
`dependent_launch(device)`, whether to launch with the attribute (CUDA graphs keep it as a programmatic edge).
Without it (sm_80/sm_87, the interpreter, `EDGEATTN_PDL=0`) the same kernels compile with USE_PDL=False and
none of this code exists in them.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

L2_LINE_BYTES = 128


@triton.jit
def prefetch_l2(P, n_elems, LINE: tl.constexpr, LINES: tl.constexpr):
    """Ask for the 128-byte lines of the contiguous range [P, P + n_elems) in L2 (LINE: elements a line; LINES:
    a power of two >= the lines of the range; the extra ones repeat the last line). No registers wait on it."""
    offs = tl.minimum(tl.arange(0, LINES) * LINE, n_elems - 1)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [P + offs], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def dependent_start(USE_PDL: tl.constexpr):
    """Wait until the kernel before this one has completed and its writes are visible, then let the next kernel of
    the chain launch (its programs wait in their own dependent_start). A no-op without USE_PDL."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def dependent_launch(device) -> bool:
    """Launch the decode step's kernels as programmatic dependents: a CUDA device of compute capability 9.0 or
    newer, unless EDGEATTN_PDL=0 (read at each launch, so a benchmark can compare both in one process)."""
    if getattr(device, "type", "cpu") != "cuda" or os.environ.get("EDGEATTN_PDL", "1") == "0":
        return False
    import torch

    return torch.cuda.get_device_capability(device)[0] >= 9


def lines_of(n_elems: int, element_bytes: int) -> tuple[int, int]:
    """(LINE, LINES) for prefetch_l2 over n_elems contiguous elements of element_bytes each."""
    line = max(L2_LINE_BYTES // element_bytes, 1)
    return line, triton.next_power_of_2(max(-(-n_elems // line), 1))


__all__ = ["dependent_launch", "dependent_start", "lines_of", "prefetch_l2"]
