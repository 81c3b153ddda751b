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
        self.sources: list[Callable[[], Snapshot]] = []
        r.register(_DeviceCollector(self.sources))

    def add_source(self, source: Callable[[], Snapshot]) -> None:
        """Add a device reading source (e.g. `controller.metrics_snapshot`), read at each scrape."""
        self.sources.append(source)


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
