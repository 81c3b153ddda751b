"""Workloads for simulation: ambient, load phases and the simulated device's power and latency.

A workload is a preset name (`hot-ambient`, `mild`) or a TOML/YAML/JSON file:

    ambient_c = 45
    hz = 2                    # controller rate (the simulation step is 1/hz)
    noise_c = 0.3             # sensor noise (standard deviation)
    max_window = 512
    phases = [{seconds = 60, load = 0.0}, {seconds = 1500, load = 1.0}]
    [device]                  # DevicePower fields: idle_w, mlp_w, attention_w, trip_c, ...
    trip_c = 99
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from edgeattn.errors import ConfigError, InputError
from edgeattn.optional import require
from edgeattn.runtime.thermal.offline.simulated_device import DevicePower


@dataclass(frozen=True)
class Workload:
    name: str
    phases: tuple[tuple[float, float], ...]  # (seconds, load 0..1)
    ambient_c: float | None = None  # None: the model's ambient
    hz: float = 2.0
    noise_c: float = 0.3
    seed: int = 0
    max_window: int = 512
    temp0_c: float | None = None  # None: idle steady state
    device: DevicePower = field(default_factory=DevicePower)

    def __post_init__(self) -> None:
        if not self.phases or any(s <= 0 or not 0 <= load <= 1 for s, load in self.phases):
            raise ConfigError(f"workload {self.name}: expected phases of seconds > 0 and load in [0, 1], found {self.phases}")
        if not 1 <= self.hz <= 5:
            raise ConfigError(f"workload {self.name}: hz: expected 1-5, found {self.hz}")
        if self.noise_c < 0 or self.max_window < 1:
            raise ConfigError(f"workload {self.name}: expected noise_c >= 0 and max_window >= 1")

    @property
    def duration_s(self) -> float:
        return sum(s for s, _ in self.phases)

    def load_at(self, t: float) -> float:
        end = 0.0
        for seconds, load in self.phases:
            end += seconds
            if t < end:
                return load
        return self.phases[-1][1]


PRESETS: dict[str, Workload] = {
    # a fanless box in a hot cabinet: long busy stretches, one lighter stretch
    "hot-ambient": Workload("hot-ambient", ((60, 0.0), (900, 1.0), (300, 0.6), (480, 1.0), (60, 0.0)), ambient_c=45.0),
    "mild": Workload("mild", ((60, 0.0), (600, 1.0), (120, 0.0), (600, 1.0)), ambient_c=25.0),
}


def workload_from_dict(data: dict, name: str) -> Workload:
    data = dict(data)
    device = DevicePower(**data.pop("device", {}))
    phases = tuple((float(p["seconds"]), float(p["load"])) for p in data.pop("phases", []))
    known = {f.name for f in dataclasses.fields(Workload)} - {"name", "phases", "device"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"workload {name}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return Workload(name=name, phases=phases, device=device, **data)


def load_workload(spec: str) -> Workload:
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise InputError(f"workload {spec!r}: expected a preset ({', '.join(PRESETS)}) or a .toml/.yaml/.json file")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = require("yaml", "reading YAML workloads (pip install pyyaml)").safe_load(text)
        else:
            data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"workload {path}: cannot parse: {exc}") from exc
    try:
        return workload_from_dict(data, path.stem)
    except (TypeError, KeyError) as exc:
        raise ConfigError(f"workload {path}: {exc}") from exc
