"""Choosing the next token: greedy, or sampled with temperature, top-k and top-p, reproducible with a seed."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgeattn.errors import ConfigError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus: the smallest set of tokens whose probability reaches top_p
    top_k: int = 0  # 0 = no limit
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature: expected a finite number >= 0 (0 = greedy), found {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p: expected a number in (0, 1], found {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ConfigError(f"top_k: expected an integer >= 0 (0 = no limit), found {self.top_k!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0):
            raise ConfigError(f"seed: expected an integer >= 0, found {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler:
    """One per stream: its own random generator, so a seed reproduces the stream whatever runs beside it."""

    def __init__(self, config: SamplingConfig) -> None:
        self.config = config
        self.rng = np.random.default_rng(config.seed)

    def __call__(self, logits: np.ndarray) -> int:
        """logits: [V] -> token id."""
        c = self.config
        if c.greedy:
            return int(np.argmax(logits))
        x = logits.astype(np.float64) / c.temperature
        if c.top_k and c.top_k < x.size:
            kth = np.partition(x, -c.top_k)[-c.top_k]
            x = np.where(x < kth, -np.inf, x)
        p = np.exp(x - x.max())
        p /= p.sum()
        if c.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            keep = np.cumsum(p[order]) - p[order] < c.top_p  # the first token is always kept
            mask = np.zeros_like(p, dtype=bool)
            mask[order[keep]] = True
            p = np.where(mask, p, 0.0)
            p /= p.sum()
        return int(self.rng.choice(p.size, p=p))
