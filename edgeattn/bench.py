"""`edgeattn bench`: trtexec-style latency and throughput of a bundle on its runtime backend; for cuda bundles,
decode tokens/s and time to first token through the decode engine (`run_decoder`)."""

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


DEFAULT_PROMPT = 128  # decoder bench: prompt tokens per stream
DEFAULT_DECODE_STEPS = 128


@dataclass(frozen=True)
class DecodeResult:
    """A decoder bundle through the engine: every stream prefilled, then decode steps for all of them at once."""

    bundle: str
    backend: str
    streams: int
    prompt_tokens: int
    window: int | None
    ttft_ms: tuple[float, ...]  # per stream: the job's arrival to its first token
    step_ms: tuple[float, ...]  # per decode step (every stream one token)

    def stats(self) -> dict:
        lat = np.asarray(self.step_ms)
        mean = float(lat.mean())
        ttft = np.asarray(self.ttft_ms)
        return {
            "bundle": self.bundle, "backend": self.backend, "kind": "decoder",
            "sizes": {"streams": self.streams, "prompt_tokens": self.prompt_tokens}, "window": self.window,
            "iterations": len(self.step_ms),
            "min_ms": float(lat.min()), "mean_ms": mean, "p50_ms": float(np.percentile(lat, 50)),
            "p90_ms": float(np.percentile(lat, 90)), "p99_ms": float(np.percentile(lat, 99)),
            "max_ms": float(lat.max()),
            "decode_tokens_per_s": self.streams * 1000.0 / mean, "throughput_per_s": self.streams * 1000.0 / mean,
            "queries_per_s": 1000.0 / mean,
            "ttft_mean_ms": float(ttft.mean()), "ttft_max_ms": float(ttft.max()),
        }


def is_engine_bundle(bundle) -> bool:
    """Bundles `bench` times through the decode engine: cuda bundles (they have no graph `infer` to time)."""
    return bundle.manifest.backend == "cuda"


def run_decoder(bundle, config: BenchConfig = BenchConfig()) -> DecodeResult:
    """`batch` streams (default 1) of `seq` random prompt tokens (default 128), each prefilled in one chunk, then
    `iterations` decode steps (default 128) after `warmup` untimed ones. End of text is ignored, so every stream
    decodes every step; greedy."""
    from edgeattn.runtime.generation.decoder_bundle import open_decoder
    from edgeattn.runtime.generation.engine import Engine, new_job
    from edgeattn.runtime.generation.sampling import SamplingConfig

    if config.duration is not None:
        raise ConfigError("--duration: a decoder bundle is timed over --iterations decode steps; give those instead")
    streams, prompt = config.batch or 1, config.seq or DEFAULT_PROMPT
    steps = config.iterations or DEFAULT_DECODE_STEPS
    model = open_decoder(bundle, threads=config.threads)
    window = model.check_window(config.window or 0)
    model.eos = set()  # every stream generates to the end of the run
    model.activate()
    rng = np.random.default_rng(config.seed)
    events: list = []
    try:
        engine = Engine(model, slots=streams, prefill_chunk=min(prompt, model.layout.window_max),
                        window=lambda: window, deliver=events.extend)

        def submit(max_tokens: int) -> list:
            jobs = [new_job(model.layout, rng.integers(0, model.vocab_size, prompt).tolist(), max_tokens=max_tokens,
                            sampling=SamplingConfig()) for _ in range(streams)]
            for job in jobs:
                engine.add(job)
            return jobs

        if config.warmup:  # the prefill and every decode graph of this batch, untimed
            submit(config.warmup + 1)
            while not engine.idle():
                engine.step()
        events.clear()
        jobs, first, step_ms = submit(steps + streams + 1), {}, []  # never done before `steps` are timed
        while not engine.idle():
            decoding = len(engine.decoding) == streams and not engine.prefilling and len(step_ms) < steps
            t0 = time.perf_counter()
            engine.step()
            now = time.perf_counter()
            if decoding:
                step_ms.append((now - t0) * 1000.0)
                if len(step_ms) == steps:
                    engine.end_all()
            for job, event in events:
                if event.tokens and job not in first:
                    first[job] = now
            events.clear()
    finally:
        model.deactivate()
    ttft = tuple((first[j] - j.arrived) * 1000.0 for j in jobs if j in first)
    return DecodeResult(str(bundle.path), bundle.manifest.backend, streams, prompt, config.window, ttft,
                        tuple(step_ms))


def run(bundle_path: str | Path, config: BenchConfig = BenchConfig()) -> BenchResult | DecodeResult:
    """Verify the bundle, then time `infer` on fixed inputs (cuda bundles: `run_decoder`)."""
    from edgeattn.runtime.backends import open_backend

    bundle = open_bundle(bundle_path)
    if is_engine_bundle(bundle):
        return run_decoder(bundle, config)
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
