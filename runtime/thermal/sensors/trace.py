"""Trace files: CSV with a header; `t` (s), `temp_c` (hottest zone), `power_w`, then any extra columns."""

from __future__ import annotations

import csv
import io
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgeattn import atomic
from edgeattn.errors import InputError
from edgeattn.runtime.thermal.readings import Reading, Sensor

REQUIRED = ("t", "temp_c", "power_w")


@dataclass(frozen=True)
class Trace:
    columns: dict[str, np.ndarray]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def __len__(self) -> int:
        return len(self.columns["t"])


def _number(text: str) -> float:
    return float(text) if text.strip() not in ("", "nan", "None") else math.nan


def read_trace(path: Path) -> Trace:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"trace {path}: file not found")
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise InputError(f"trace {path}: empty file, expected a header with {', '.join(REQUIRED)}")
    header, body = [h.strip() for h in rows[0]], rows[1:]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise InputError(f"trace {path}: expected columns {', '.join(REQUIRED)}, missing {', '.join(missing)} "
                         f"(found {', '.join(header)})")
    columns: dict[str, list[float]] = {h: [] for h in header}
    for line, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise InputError(f"trace {path} line {line}: expected {len(header)} fields, found {len(row)}")
        for h, cell in zip(header, row):
            try:
                columns[h].append(_number(cell))
            except ValueError:
                columns[h].append(math.nan)  # text columns (e.g. faults) are not numbers
    return Trace({h: np.asarray(v, dtype=np.float64) for h, v in columns.items()})


def reading_row(r: Reading, t0: float, zones: list[str]) -> dict[str, object]:
    row: dict[str, object] = {"t": round(r.t - t0, 3), "temp_c": r.temp_c, "power_w": r.power_w,
                              "clock_mhz": r.clock_mhz, "throttle": int(r.throttle)}
    row.update({f"temp_{z}": r.temps.get(z) for z in zones})
    row["faults"] = "; ".join(map(str, r.faults))
    return row


def rows_to_csv(rows: list[dict[str, object]]) -> str:
    buf = io.StringIO()
    header = list(rows[0]) if rows else list(REQUIRED)
    writer = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def record(sensor: Sensor, seconds: float, out: Path, hz: float = 2.0, clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep) -> int:
    """Sample `sensor` at `hz` for `seconds` and write the trace atomically; returns the number of rows."""
    if not 0 < hz <= 50:
        raise InputError(f"record rate: expected 0 < hz <= 50, found {hz}")
    rows: list[dict[str, object]] = []
    zones: list[str] = []
    t0 = clock()
    period = 1.0 / hz
    k = 0
    while clock() - t0 < seconds:
        r = sensor.read()
        zones += [z for z in r.temps if z not in zones]
        rows.append(reading_row(r, t0, zones))
        k += 1
        sleep(max(0.0, t0 + k * period - clock()))
    for row in rows:  # zones that appeared late get empty cells in earlier rows
        for z in zones:
            row.setdefault(f"temp_{z}", None)
        row["faults"] = row.pop("faults")
    atomic.write_text(Path(out), rows_to_csv(rows))
    return len(rows)
