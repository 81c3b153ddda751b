"""Prometheus metrics of the service, in a registry of its own (one per app), and device sensor gauges.

Device readings come from sources: callables returning a snapshot dict, read at scrape time. The thermal
controller is one (its `metrics_snapshot()`); `sysfs_sensors` reads Linux thermal zones and hwmon power.
A snapshot maps a metric name to a number, or to {sensor label: number}:

    {"temperature_celsius": {"gpu-thermal": 61.5}, "power_watts": {"VDD_IN": 7.2}, "throttled": 0}

Each key becomes the gauge `edgeattn_device_<key>` (with a `sensor` label for dicts).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

Snapshot = dict[str, "float | dict[str, float]"]
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
_NAME = re.compile(r"[^a-zA-Z0-9_]")


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("edgeattn_requests", "Inference requests by model and outcome",
                                ["model", "status"], registry=r)
        self.latency = Histogram("edgeattn_request_latency_seconds", "Request latency (body read to answer)",
                                 ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram("edgeattn_queue_time_seconds", "Time a request waited for its batch",
                                    ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.compute_time = Histogram("edgeattn_compute_seconds", "Backend time per batch",
                                      ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("edgeattn_batch_size", "Rows per executed batch", ["model"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.queue_depth = Gauge("edgeattn_queue_depth", "Requests waiting", ["model"], registry=r)
        self.window = Gauge("edgeattn_attention_window", "Active attention window (0 = full)", registry=r)
        self.window_locked = Gauge("edgeattn_attention_window_locked", "1 while the window is locked", registry=r)
        self.generation = GenerationMetrics(r)
        self.sources: list[Callable[[], Snapshot]] = []
        r.register(_DeviceCollector(self.sources))

    def add_source(self, source: Callable[[], Snapshot]) -> None:
        """Add a device reading source (e.g. `controller.metrics_snapshot`), read at each scrape."""
        self.sources.append(source)


TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)


class GenerationMetrics:
    """Decoder bundles, named as vLLM / llama.cpp / Triton's TensorRT-LLM backend name them (docs/serving.md)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self.ttft = Histogram("edgeattn_time_to_first_token_seconds", "Arrival to the first generated token",
                              ["model"], buckets=TOKEN_BUCKETS + (10.0, 30.0), registry=r)
        self.itl = Histogram("edgeattn_inter_token_latency_seconds", "Time between two tokens of one request",
                             ["model"], buckets=TOKEN_BUCKETS, registry=r)
        self.prompt_tokens = Counter("edgeattn_prompt_tokens", "Prompt tokens received", ["model"], registry=r)
        self.generation_tokens = Counter("edgeattn_generation_tokens", "Tokens generated", ["model"], registry=r)
        self.finished = Counter("edgeattn_request_success", "Generation requests ended, by finish reason",
                                ["model", "finished_reason"], registry=r)
        self.running = Gauge("edgeattn_requests_running", "Slots busy (prefilling or decoding)", ["model"],
                             registry=r)
        self.waiting = Gauge("edgeattn_requests_waiting", "Generation requests queued for a slot", ["model"],
                             registry=r)
        self.slots = Gauge("edgeattn_slots", "Slots (requests that can generate at once)", ["model"], registry=r)
        self.cache_bytes = Gauge("edgeattn_kv_cache_bytes", "Bytes of the KV cache allocated for every slot",
                                 ["model"], registry=r)
        self.slot_bytes = Gauge("edgeattn_kv_cache_slot_bytes", "Bytes of KV cache a slot takes", ["model"],
                                registry=r)
        self.kv_tokens = Gauge("edgeattn_kv_cache_tokens", "Tokens whose keys and values the cache holds",
                               ["model"], registry=r)
        self.evicted = Counter("edgeattn_kv_cache_evicted_tokens", "Tokens dropped from the cache (ring "
                               "overwrites and the middle of prompts longer than the cache)", ["model"], registry=r)
        self.step_seconds = Histogram("edgeattn_decode_step_seconds", "One batched decode step", ["model"],
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.step_rows = Histogram("edgeattn_decode_step_rows", "Slots in one decode step", ["model"],
                                   buckets=BATCH_BUCKETS, registry=r)
        # the live attention budget (next to edgeattn_attention_window), read from the engine at each scrape
        self.budget_rows = Gauge("edgeattn_attention_budget_rows", "Rows a query reads at most under the live "
                                 "budget: sinks + window + pages x page", ["model"], registry=r)
        self.budget_pages = Gauge("edgeattn_attention_budget_pages", "Retrieval pages of the live budget "
                                  "(0 = the window alone)", ["model"], registry=r)
        # a model served on several GPUs (serve --devices): its engines, one per GPU, beside the model's totals
        self.device_slots = Gauge("edgeattn_device_slots", "Slots of the model's engine on one GPU",
                                  ["model", "device"], registry=r)
        self.device_running = Gauge("edgeattn_device_requests_running", "Slots busy on one GPU",
                                    ["model", "device"], registry=r)
        self.device_waiting = Gauge("edgeattn_device_requests_waiting", "Requests queued for one GPU's slots",
                                    ["model", "device"], registry=r)


class _DeviceCollector:
    def __init__(self, sources: list[Callable[[], Snapshot]]) -> None:
        self.sources = sources

    def describe(self):
        return []  # readings are only known at scrape time

    def collect(self):
        families: dict[str, GaugeMetricFamily] = {}
        for source in self.sources:
            try:
                snapshot = source()
            except Exception:  # a failing sensor must not break the scrape
                continue
            for key, value in snapshot.items():
                name = "edgeattn_device_" + _NAME.sub("_", key)
                if isinstance(value, dict):
                    fam = families.setdefault(name, GaugeMetricFamily(name, f"Device reading {key}",
                                                                      labels=["sensor"]))
                    for sensor, reading in value.items():
                        if _finite(reading):
                            fam.add_metric([str(sensor)], float(reading))
                elif _finite(value):
                    fam = families.setdefault(name, GaugeMetricFamily(name, f"Device reading {key}"))
                    fam.add_metric([], float(value))
        yield from families.values()


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def sysfs_sensors(root: Path = Path("/sys/class")) -> Callable[[], Snapshot]:
    """A source reading thermal zones (millidegrees C) and hwmon power (microwatts), where they exist."""

    def read() -> Snapshot:
        temps, power = {}, {}
        for zone in sorted((root / "thermal").glob("thermal_zone*")):
            try:
                value = int((zone / "temp").read_text().strip())
                kind = (zone / "type").read_text().strip() or zone.name
            except (OSError, ValueError):
                continue
            if value > -200_000:  # powered-off blocks read -256 C
                temps[kind] = value / 1000.0
        for path in sorted((root / "hwmon").glob("hwmon*/power*_input")):
            try:
                name_file = path.parent / "name"
                label = name_file.read_text().strip() if name_file.exists() else path.parent.name
                power[f"{label}/{path.name[:-6]}"] = int(path.read_text().strip()) / 1e6
            except (OSError, ValueError):
                continue
        snapshot: Snapshot = {}
        if temps:
            snapshot["temperature_celsius"] = temps
        if power:
            snapshot["power_watts"] = power
        return snapshot

    return read
