"""When does 2:4 pay? A per-shape speed table (measured) with a size rule as the fallback.

The table is the JSON `benchmarks/sparse_speed_h200.py` writes (schema edgeattn.sparse_speed/1): rows of
{M, N, K, dtype, dense_ms, sparse_ms, speedup, error}. The packaged `sparse_speed.json` was measured on
the lent H200 (torch semi-structured sparsity, cuSPARSELt); replace it with a newer run of the script.

For a shape the table does not hold, the size rule decides: prune only when M*N*K >= RULE_MIN_MACS.
Basis of the rule (FIELD_NOTES, H200, fp16): 1.29-1.41x at 8192x4096x16384 (5.5e11 MACs), 0.025x
(40x slower) at 2048x768x3072 (4.8e9 MACs); the packaged table agrees (the smallest shape that gains
is the SmolLM2 LM head in int8 at M=8192, 2.3e11 MACs).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from edgeattn.errors import ConfigError

SCHEMA = "edgeattn.sparse_speed/1"
RULE_MIN_MACS = 2e11
PACKAGED = "speed_table.json"


@dataclass(frozen=True)
class Verdict:
    gains: bool
    basis: str  # "measured table" | "size rule"
    speedup: float | None
    reason: str


@dataclass(frozen=True)
class SpeedTable:
    rows: tuple[dict, ...]
    source: str
    device: str
    rule_min_macs: float = RULE_MIN_MACS

    def decide(self, n: int, k: int, m: int, dtype: str, min_speedup: float = 1.05) -> Verdict:
        """Whether a [M, K] x [K, N] GEMM gains from 2:4 at `dtype`, from the row nearest in M."""
        rows = [r for r in self.rows if r["N"] == n and r["K"] == k and r["dtype"] == dtype]
        if not rows:
            macs = float(m) * n * k
            gains = macs >= self.rule_min_macs
            cmp = ">=" if gains else "<"
            return Verdict(gains, "size rule", None,
                           f"no measurement for N={n} K={k} {dtype}; M*N*K = {macs:.3g} {cmp} {self.rule_min_macs:.3g}")
        row = min(rows, key=lambda r: abs(math.log(r["M"]) - math.log(m)))
        where = f"{self.device} M={row['M']} N={n} K={k} {dtype}"
        if row.get("error") or not row.get("speedup"):
            return Verdict(False, "measured table", None, f"sparse kernel failed at {where}: {row.get('error')}")
        s = float(row["speedup"])
        gains = s >= min_speedup
        return Verdict(gains, "measured table", s,
                       f"{'gains' if gains else 'loses'}: {s:.2f}x sparse vs dense at {where} (needs >= {min_speedup:g}x)")


def _validate(data, source: str) -> SpeedTable:
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ConfigError(f"{source}: expected a JSON object with a 'rows' list ({SCHEMA}), found {type(data).__name__}")
    if data.get("schema", SCHEMA) != SCHEMA:
        raise ConfigError(f"{source}: expected schema {SCHEMA}, found {data.get('schema')!r}")
    rows = []
    for i, r in enumerate(data["rows"]):
        missing = [key for key in ("M", "N", "K", "dtype") if key not in r]
        if missing:
            raise ConfigError(f"{source}: row {i} lacks {', '.join(missing)}")
        rows.append({**r, "M": int(r["M"]), "N": int(r["N"]), "K": int(r["K"])})
    rule = float(data.get("rule_min_macs", RULE_MIN_MACS))
    return SpeedTable(tuple(rows), source, str(data.get("device", "unknown device")), rule)


def load_table(path: str | Path | None = None) -> SpeedTable:
    """The speed table at `path`, or the packaged one."""
    if path is None:
        text = resources.files("edgeattn.quantize.sparsity").joinpath(PACKAGED).read_text(encoding="utf-8")
        source = f"packaged {PACKAGED}"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"speed table {path}: cannot read it ({exc.strerror})") from None
        source = str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: expected JSON, found a parse error at line {exc.lineno}") from None
    return _validate(data, source)
