"""Choosing the next token on the device, for a batch of streams with their own settings: greedy, or sampled with
temperature, top-k and top-p, reproducible per stream from its seed and its token count.

Everything is tensor arithmetic with static shapes, so it is captured in the decode step's CUDA graph and only
token ids cross to the host. The randomness is counter-based: the uniform number for (stream, vocabulary entry)
is a hash of (seed, tokens drawn so far, entry), so a stream's draws do not depend on which streams run beside
it, on the batch size, or on the step it was admitted at. A draw is the Gumbel-max trick over the kept tokens,
which samples them in proportion to softmax(logits / T) (the same distribution as
edgeattn.runtime.generation.sampling.Sampler, not the same numbers).

    params = DeviceSampling.for_streams(batch, device)     # static buffers, graph inputs
    params.set(row, SamplingConfig(...), drawn=0)          # on admission
    ids = sample(logits, params)                           # [B] int64
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


def uniforms(seeds, drawn, vocab: int):
    """[B] int64 seeds and draw counters -> [B, vocab] float32 in (0, 1)."""
    entry = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    key = _mix(torch, seeds * _GOLDEN + drawn)  # [B]
    z = _mix(torch, key[:, None] + entry[None, :] * _GOLDEN)
    bits = (z >> 8) & 0xFFFFFF  # 24 bits from the low half (the top bit of a sign-extended mix is always 0)
    return (bits.float() + 0.5) / float(1 << 24)


class DeviceSampling:
    """Per-stream settings as device tensors: temperature (0 = greedy), top_k (0 = none), top_p, seed, drawn."""

    def __init__(self, temperature, top_k, top_p, seeds, drawn) -> None:
        self.temperature, self.top_k, self.top_p, self.seeds, self.drawn = temperature, top_k, top_p, seeds, drawn

    @classmethod
    def for_streams(cls, streams: int, device) -> "DeviceSampling":
            return cls(torch.zeros(streams, device=device), torch.zeros(streams, dtype=torch.int64, device=device),
                   torch.ones(streams, device=device), torch.zeros(streams, dtype=torch.int64, device=device),
                   torch.zeros(streams, dtype=torch.int64, device=device))

    def set(self, row: int, config, drawn: int = 0, default_seed: int = 0) -> None:
        """config: a SamplingConfig (seed None: `default_seed`)."""
        self.temperature[row] = float(config.temperature)
        self.top_k[row] = int(config.top_k)
        self.top_p[row] = float(config.top_p)
        self.seeds[row] = int(config.seed if config.seed is not None else default_seed) & ((1 << 62) - 1)
        self.drawn[row] = int(drawn)

    def rows(self, n: int) -> "DeviceSampling":
        return DeviceSampling(self.temperature[:n], self.top_k[:n], self.top_p[:n], self.seeds[:n], self.drawn[:n])


def sample(logits, params: DeviceSampling, *, advance: bool = True):
    """logits: [B, V] -> [B] int64. Greedy rows (temperature 0) take the argmax; the others draw with Gumbel-max
    among the tokens top-k and top-p keep. `advance`: count the draw (params.drawn += 1) on the device."""
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
    gumbel = -torch.log(-torch.log(uniforms(params.seeds, params.drawn, vocab)))
    scores = torch.where(x >= floor, x + gumbel, -torch.inf)
    ids = torch.where(greedy, x.argmax(dim=-1), scores.argmax(dim=-1))
    if advance:
        params.drawn.add_(1)
    return ids
