"""How much of the GPU's memory a cuda bundle takes: the weights, then a pool of slots, then a reserve.

A slot is one stream's cache (sinks + a ring of W_max rows of keys and values in every layer) plus the
activations of one row of a step (float32 logits, and a sort's values and int64 indices over the vocabulary when
it samples). The reserve is what the pool leaves free for everything else a step allocates: the CUDA graphs of
the batch buckets, compiled kernels' workspaces, the prefill chunk's activations and the allocator's slack.

Pure arithmetic on byte counts, so it tests without a GPU; runtime/cuda/bundle.py reads the figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeattn.errors import ConfigError, TargetError

RESERVE_MIN_BYTES = 1 << 30  # 1 GiB at least is left for graphs, workspaces and the allocator's slack
RESERVE_FRACTION = 0.05  # ... or 5% of the GPU's memory, when that is more
MAX_AUTO_SLOTS = 256  # --slots auto takes at most this many (more cost memory, and the step's latency grows)
ACTIVATION_BYTES_PER_VOCAB_ENTRY = 16  # a row's fp32 logits (4) + a sort's fp32 values (4) and int64 indices (8)


def reserve_bytes(total: int) -> int:
    """What the slot pool leaves free on a GPU of `total` bytes."""
    return max(RESERVE_MIN_BYTES, int(total * RESERVE_FRACTION))


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


@dataclass(frozen=True)
class SlotPlan:
    """The slot pool of a served cuda bundle and the memory figures it was sized from."""

    slots: int
    cache_bytes_per_slot: int
    activation_bytes_per_slot: int
    free_bytes: int  # free on the GPU once the weights were loaded
    total_bytes: int
    weights_bytes: int
    reserve_bytes: int
    auto: bool  # sized from the memory (--slots auto), else asked for

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ConfigError(f"slots: expected >= 1, found {self.slots}")

    @property
    def bytes_per_slot(self) -> int:
        return self.cache_bytes_per_slot + self.activation_bytes_per_slot

    @property
    def cache_bytes(self) -> int:
        return self.slots * self.cache_bytes_per_slot

    def describe(self) -> str:
        how = f"auto, at most {MAX_AUTO_SLOTS}" if self.auto else "asked for"
        return (f"{self.slots} slots ({how}) x {mib(self.cache_bytes_per_slot)} of cache = {gib(self.cache_bytes)}; "
                f"{gib(self.free_bytes)} free of {gib(self.total_bytes)} after {gib(self.weights_bytes)} of weights, "
                f"{gib(self.reserve_bytes)} kept for activations and graphs")


def check_weights_fit(where, weights: int, free: int, total: int, device: str = "the GPU") -> None:
    """A TargetError when the weights and the reserve do not fit in what is free."""
    need = weights + reserve_bytes(total)
    if need > free:
        raise TargetError(f"{where}: the model does not fit: it needs {gib(need)} (weights {gib(weights)} + "
                          f"{gib(reserve_bytes(total))} kept for activations and graphs), found {gib(free)} free "
                          f"of {gib(total)} on {device}")


def plan_slots(where, *, free: int, total: int, weights: int, cache_bytes_per_slot: int,
               activation_bytes_per_slot: int, requested: int | None = None) -> SlotPlan:
    """`requested` slots (a ConfigError when they do not fit), or as many as fit (None), at most MAX_AUTO_SLOTS.

    `free` is what the GPU has free with the weights loaded."""
    reserve = reserve_bytes(total)
    per = cache_bytes_per_slot + activation_bytes_per_slot
    fit = max((free - reserve) // per, 0)
    figures = dict(cache_bytes_per_slot=cache_bytes_per_slot, activation_bytes_per_slot=activation_bytes_per_slot,
                   free_bytes=free, total_bytes=total, weights_bytes=weights, reserve_bytes=reserve)
    left = f"found {gib(free)} free on the GPU after {gib(weights)} of weights"
    if requested is None:
        if fit < 1:
            raise ConfigError(f"{where}: not one slot fits: a slot needs {mib(per)} and {gib(reserve)} are kept "
                              f"for activations and graphs; {left}")
        return SlotPlan(slots=min(fit, MAX_AUTO_SLOTS), auto=True, **figures)
    if requested < 1:
        raise ConfigError(f"slots: expected >= 1, found {requested}")
    if requested > fit:
        raise ConfigError(f"{where}: {requested} slots need {gib(requested * per + reserve)} ({mib(per)} a slot + "
                          f"{gib(reserve)} kept for activations and graphs), {left}: at most {fit} slots fit")
    return SlotPlan(slots=requested, auto=False, **figures)
