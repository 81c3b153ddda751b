"""benchmarks/page_choice.py decodes every (rule, budget) of a sample as one batch: the batched row choice equals,
row for row, a plain float64 loop over one mode at a time (pages in order, bounds over a page's filled rows,
the top k candidate pages per KV head by the largest score over its query heads)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "page_choice.py"


def _trial():
    spec = importlib.util.spec_from_file_location("page_choice_trial", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _score(rule: str, q: np.ndarray, rows: np.ndarray) -> float:
    """One query head q [D] against one page's filled rows [n, D]."""
    lo, hi = rows.min(0), rows.max(0)
    if rule == "centre":
        return float(q @ (lo + hi) / 2)
    if rule == "bound":
        return float(np.maximum(q * lo, q * hi).sum())
    if rule == "exact":
        return float((rows @ q).max())
    if rule.startswith("mix"):
        return float(q @ (lo + hi) / 2 + float(rule[3:]) / 100 * np.abs(q) @ (hi - lo) / 2)
    raise ValueError(rule)


def _reference(q, key, rule: str, window: int, pages: int, *, sinks: int, page: int) -> np.ndarray:
    """q [H, D], key [H_kv, T, D] float64 -> [H, T] rows read."""
    h, t = q.shape[0], key.shape[1]
    g = h // key.shape[0]
    read = np.zeros((h, t), bool)
    if rule == "full":
        return ~read
    read[:, :sinks] = True
    read[:, max(sinks, t - window):] = True
    old = t - window
    if rule == "window" or pages == 0:
        return read
    for kvh in range(key.shape[0]):
        starts = [s for s in range(sinks, t, page) if s < old]
        scores = [max(_score(rule, q[kvh * g + i], key[kvh, s:min(s + page, t)]) for i in range(g)) for s in starts]
        for j in sorted(range(len(starts)), key=lambda j: -scores[j])[:pages]:
            read[kvh * g:(kvh + 1) * g, starts[j]:min(starts[j] + page, old)] = True
    return read


@pytest.mark.parametrize("t", [9, 40, 67, 130])
def test_batched_row_choice_equals_one_mode_at_a_time(t):
    trial = _trial()
    trial.PAGE = 8
    modes = [dict(rule=r, window=w, pages=k, sink_rule="true") for r, w, k in
             [("full", 0, 0), ("window", 20, 0), ("centre", 16, 3), ("exact", 8, 5), ("bound", 24, 2),
              ("mix25", 16, 4), ("centre", 8, 0), ("exact", 40, 1)]]
    rng = np.random.default_rng(t)
    q = rng.standard_normal((len(modes), 6, 16)).astype(np.float32)  # 6 query heads, 2 KV heads, D 16
    key = rng.standard_normal((len(modes), 2, t, 16)).astype(np.float32)
    got = trial.read_mask(torch.from_numpy(q), torch.from_numpy(key), trial.plan(modes, "cpu")).numpy()
    for b, mode in enumerate(modes):
        want = _reference(q[b].astype(np.float64), key[b].astype(np.float64), mode["rule"], mode["window"],
                          mode["pages"], sinks=trial.SINKS, page=8)
        assert (got[b] == want).all(), (t, mode, np.argwhere(got[b] != want)[:5])
    if t > 40:  # the page modes read rows older than their window
        assert all(got[b, :, trial.SINKS:t - m["window"]].any() for b, m in enumerate(modes) if m["pages"])
