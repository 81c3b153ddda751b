"""Choosing the next token on the device, for a batch of streams with their own settings: greedy, or sampled with
temperature, top-k and top-p, reproducible per stream from its seed and the position of the token drawn.

Everything is tensor arithmetic with static shapes, so it is captured in the decode step's CUDA graph and only
token ids cross to the host. The randomness is counter-based: the uniform number for (stream, vocabulary entry)
is a hash of (seed, the stream position the token is drawn at, entry), so a stream's draws do not depend on which
streams run beside it, on the batch size, or on the step it was admitted at. A draw is the Gumbel-max trick over the kept tokens,
which samples them in proportion to softmax(logits / T) (the same distribution as
edgeattn.runtime.generation.sampling.Sampler, not the same numbers).

    params = DeviceSampling.for_streams(batch, device)     # static buffers, graph inputs
    params.set(row, SamplingConfig(...))                   # on admission
    ids = sample(logits, params, positions)                # [B] int64
"""

from __future__ import annotations

from edgeattn.optional import require

torch = require("torch", "sampling on the device")  # the GPU path's module: importing it means torch is wanted

# splitmix64's constants as signed 64-bit integers (torch has no uint64 arithmetic on CUDA)
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB


def _mix(torch, z):
    """splitmix64's finalizer on int64 tensors (multiplication wraps; the right shifts sign-extend, which keeps
    the map a bijection-like mixer, good enough for sampling)."""
    z = (z ^ (z >> 30)) * _MIX1
    z = (z ^ (z >> 27)) * _MIX2
    return z ^ (z >> 31)


def uniforms(seeds, counters, vocab: int):
    """[B] int64 seeds and counters (stream positions) -> [B, vocab] float32 in (0, 1)."""
    entry = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    key = _mix(torch, seeds * _GOLDEN + counters)  # [B]
    z = _mix(torch, key[:, None] + entry[None, :] * _GOLDEN)
    bits = (z >> 8) & 0xFFFFFF  # 24 bits from the low half (the top bit of a sign-extended mix is always 0)
    return (bits.float() + 0.5) / float(1 << 24)


class DeviceSampling:
    """Per-stream settings as device tensors: temperature (0 = greedy), top_k (0 = none), top_p, seed."""

    def __init__(self, temperature, top_k, top_p, seeds) -> None:
        self.temperature, self.top_k, self.top_p, self.seeds = temperature, top_k, top_p, seeds

    @classmethod
    def for_streams(cls, streams: int, device) -> "DeviceSampling":
            return cls(torch.zeros(streams, device=device), torch.zeros(streams, dtype=torch.int64, device=device),
                   torch.ones(streams, device=device), torch.zeros(streams, dtype=torch.int64, device=device))

    @property
    def tensors(self) -> tuple:
        return self.temperature, self.top_k, self.top_p, self.seeds

    def set(self, row: int, config, default_seed: int = 0) -> None:
        """config: a SamplingConfig (seed None: `default_seed`)."""
        self.temperature[row] = float(config.temperature)
        self.top_k[row] = int(config.top_k)
        self.top_p[row] = float(config.top_p)
        self.seeds[row] = int(config.seed if config.seed is not None else default_seed) & ((1 << 62) - 1)

    def rows(self, start: int, stop: int) -> "DeviceSampling":
        return DeviceSampling(*(t[start:stop] for t in self.tensors))


def sample(logits, params: DeviceSampling, counters):
    """logits: [B, V]; counters: [B] int64, the stream position each token is drawn at -> [B] int64. Greedy rows
    (temperature 0) take the argmax; the others draw with Gumbel-max among the tokens top-k and top-p keep."""
    b, vocab = logits.shape
    greedy = params.temperature <= 0
    x = logits.float() / torch.where(greedy, 1.0, params.temperature)[:, None]
    top, _ = torch.sort(x, dim=-1, descending=True)  # [B, V]
    # top-k: the k-th largest value is the floor (k = 0 or >= V: no floor)
    no_k = (params.top_k <= 0) | (params.top_k >= vocab)
    floor_k = top.gather(1, (torch.where(no_k, 1, params.top_k) - 1)[:, None])
    floor_k = torch.where(no_k[:, None], -torch.inf, floor_k)
    # top-p: keep a token while the mass before it is below p (the first is always kept)
    probs = torch.softmax(top, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    kept = (before < params.top_p[:, None]).sum(-1)  # [B] >= 1
    floor_p = top.gather(1, (kept - 1)[:, None])
    floor_p = torch.where((params.top_p >= 1.0)[:, None], -torch.inf, floor_p)
    floor = torch.maximum(floor_k, floor_p)
    gumbel = -torch.log(-torch.log(uniforms(params.seeds, counters, vocab)))
    scores = torch.where(x >= floor, x + gumbel, -torch.inf)
    return torch.where(greedy, x.argmax(dim=-1), scores.argmax(dim=-1))
