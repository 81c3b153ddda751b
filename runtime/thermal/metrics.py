"""Prometheus metrics for the thermal controller: a collector that reads `metrics_snapshot()` on scrape.

    registry.register(ThermalCollector(controller))   # prometheus_client.CollectorRegistry
"""

from __future__ import annotations

from edgeattn.optional import require


class ThermalCollector:
    def __init__(self, controller, prefix: str = "edgeattn") -> None:
        self.controller, self.prefix = controller, prefix

    def describe(self):
        return []  # unchecked collector: families are created on each scrape

    def collect(self):
        core = require("prometheus_client.core", "Prometheus metrics (pip install 'edgeattn[serve]')")
        m, p = self.controller.metrics_snapshot(), self.prefix
        temps = core.GaugeMetricFamily(f"{p}_thermal_temperature_celsius", "Zone temperature (valid zones).",
                                       labels=["zone"])
        for zone, value in sorted(m["zone_temps_c"].items()):
            temps.add_metric([zone], value)
        yield temps
        for name, key, doc in (("thermal_hottest_celsius", "temp_c", "Hottest valid zone."),
                               ("thermal_trip_celsius", "trip_c", "Throttle trip point."),
                               ("thermal_power_watts", "power_w", "Device power."),
                               ("thermal_clock_mhz", "clock_mhz", "SM / GPU clock."),
                               ("thermal_time_to_trip_seconds", "time_to_trip_s", "Predicted time to the trip point."),
                               ("attention_window", "window", "Attention window in tokens (0 = full)."),
                               ("attention_window_fraction", "window_fraction", "Window as a fraction of the max.")):
            if m[key] is not None:
                yield core.GaugeMetricFamily(f"{p}_{name}", doc, value=float(m[key]))
        yield core.GaugeMetricFamily(f"{p}_thermal_throttle", "1 while the device throttles.", value=float(m["throttle"]))
        yield core.GaugeMetricFamily(f"{p}_attention_window_locked", "1 while an admin lock holds the window.",
                                     value=float(m["locked"]))
        yield core.CounterMetricFamily(f"{p}_thermal_window_changes", "Window changes made by the controller.",
                                       value=m["window_changes"])
        lost = core.GaugeMetricFamily(f"{p}_thermal_zone_lost", "1 while a zone that was read before is faulted "
                                      "or not yet trusted again: it counts as hot (smallest window).", labels=["zone"])
        for zone, value in m["zones_lost"].items():
            lost.add_metric([zone], float(value))
        yield lost
        faults = core.CounterMetricFamily(f"{p}_thermal_sensor_faults", "Sensor fault samples by zone and kind "
                                          "(the detail is in the log).", labels=["zone", "kind"])
        for key, count in m["sensor_fault_counts"].items():
            faults.add_metric(key.rsplit(":", 1), count)
        yield faults
