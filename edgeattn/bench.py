"""`edgeattn bench`: trtexec-style latency and throughput of a bundle on its runtime backend."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeattn.bundle.folder import open_bundle
from edgeattn.errors import ConfigError
from edgeattn.sample_inputs import make_inputs


@dataclass(frozen=True)
class BenchConfig:
    batch: int | None = None  # None: the bundle's opt batch
    seq: int | None = None  # None: the bundle's opt sequence length
    warmup: int = 10
    iterations: int | None = None
    duration: float | None = None  # seconds; used when iterations is None
    window: int | None = None  # attention window for bundles that take one (0 = full)
    threads: int = 0  # 0: the runtime's default
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("batch", "seq", "iterations"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name}: expected >= 1, found {value}")
        if self.warmup < 0:
            raise ConfigError(f"warmup: expected >= 0, found {self.warmup}")
        if self.duration is not None and self.duration <= 0:
            raise ConfigError(f"duration: expected > 0 seconds, found {self.duration}")
        if self.iterations is not None and self.duration is not None:
            raise ConfigError("give --iterations or --duration, not both")
        if self.window is not None and self.window < 0:
            raise ConfigError(f"window: expected >= 0 (0 = full), found {self.window}")


@dataclass(frozen=True)
class BenchResult:
    bundle: str
    backend: str
    sizes: dict[str, int]
    window: int | None
    iterations: int
    latencies_ms: tuple[float, ...]

    def stats(self) -> dict:
        lat = np.asarray(self.latencies_ms)
        batch = next((v for k, v in self.sizes.items() if k.startswith("batch")), 1)
        mean = float(lat.mean())
        return {
            "bundle": self.bundle, "backend": self.backend, "sizes": self.sizes, "window": self.window,
            "iterations": self.iterations,
            "min_ms": float(lat.min()), "mean_ms": mean, "p50_ms": float(np.percentile(lat, 50)),
            "p90_ms": float(np.percentile(lat, 90)), "p99_ms": float(np.percentile(lat, 99)),
            "max_ms": float(lat.max()),
            "throughput_per_s": batch * 1000.0 / mean,  # samples per second
            "queries_per_s": 1000.0 / mean,
        }


def _sizes(manifest, config: BenchConfig) -> dict[str, int]:
    sizes = {}
    kinds = manifest.sections.get("dimension_kinds", {})
    for dim, (lo, opt, hi) in manifest.shape_ranges.items():
        want = {"batch": config.batch, "seq": config.seq}.get(kinds.get(dim, ""))
        value = opt if want is None else want
        if not lo <= value <= hi:
            raise ConfigError(f"{dim}: {value} is outside the bundle's range {lo}..{hi}")
        sizes[dim] = value
    return sizes


def run(bundle_path: str | Path, config: BenchConfig = BenchConfig()) -> BenchResult:
    """Verify the bundle, then time `infer` on fixed inputs."""
    from edgeattn.runtime.backends import open_backend

    bundle = open_bundle(bundle_path)
    m = bundle.manifest
    if config.window is not None and m.input("window") is None:
        raise ConfigError(f"--window: bundle {m.name!r} has no attention-window input")
    sizes = _sizes(m, config)
    feeds = make_inputs(m.inputs, sizes, seed=config.seed, window=config.window or 0)
    backend = open_backend(bundle, threads=config.threads)
    backend.activate()
    try:
        for _ in range(config.warmup):
            backend.infer(feeds)
        latencies = []
        deadline = time.perf_counter() + (config.duration or 0)
        target_iters = config.iterations or (None if config.duration else 100)
        while True:
            t0 = time.perf_counter()
            backend.infer(feeds)
            latencies.append((time.perf_counter() - t0) * 1000.0)
            if target_iters is not None and len(latencies) >= target_iters:
                break
            if target_iters is None and time.perf_counter() >= deadline:
                break
    finally:
        backend.deactivate()
    return BenchResult(str(bundle.path), backend.name, sizes, config.window, len(latencies), tuple(latencies))
