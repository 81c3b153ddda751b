"""Search predictive-policy parameters for the highest quality-weighted throughput with zero trip crossings.

Each candidate runs the workload on the simulated device for several sensor-noise seeds, on the fitted
model and on one whose R is `r_errors` higher (the policy keeps the fitted numbers); it is eligible
only with no trip crossing in any seed and at most `max_changes_per_min` window changes per minute
(default 2: one change per 30 s). The best eligible one wins; ties go to the larger mean window, then to
fewer window changes. Every candidate splits its levels' rows by `budget` (recent = 1.0: the window alone).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from edgeattn.errors import ConfigError, InputError
from edgeattn.runtime.thermal.policies import BudgetSplit, PredictivePolicy
from edgeattn.runtime.thermal.offline.quality import QualityTable
from edgeattn.runtime.thermal.offline.simulate import Summary, simulate
from edgeattn.runtime.thermal.offline.simulated_device import RCModel
from edgeattn.runtime.thermal.offline.workload import Workload

LEVEL_SETS = ((1.0, 0.75, 0.5, 0.375, 0.25), (1.0, 0.5, 0.25))


@dataclass(frozen=True)
class TuneConfig:
    margins_c: tuple[float, ...] = (1.5, 3.0, 5.0)
    horizons_s: tuple[float, ...] = (30.0, 90.0)
    min_holds_s: tuple[float, ...] = (30.0, 60.0)
    up_margins_c: tuple[float, ...] = (1.0, 3.0)
    level_sets: tuple[tuple[float, ...], ...] = LEVEL_SETS
    seeds: tuple[int, ...] = (0, 1)
    r_errors: tuple[float, ...] = (0.0, 0.05)  # also run on a device whose R is this much above the fit
    max_changes_per_min: float = 2.0
    budget: BudgetSplit = BudgetSplit()  # the split of every candidate's levels

    def __post_init__(self) -> None:
        if not all((self.margins_c, self.horizons_s, self.min_holds_s, self.up_margins_c, self.level_sets, self.seeds)):
            raise ConfigError("tune: every search axis needs at least one value")
        if not self.r_errors or any(not -0.5 < e < 1.0 for e in self.r_errors):
            raise ConfigError(f"r_errors: expected values in (-0.5, 1), found {self.r_errors}")
        if self.max_changes_per_min <= 0:
            raise ConfigError(f"max_changes_per_min: expected > 0, found {self.max_changes_per_min}")


@dataclass(frozen=True)
class Trial:
    policy: PredictivePolicy
    summaries: tuple[Summary, ...]

    @property
    def score(self) -> float:
        return sum(s.quality_weighted_throughput for s in self.summaries) / len(self.summaries)

    @property
    def crossings(self) -> int:
        return sum(s.trip_crossings for s in self.summaries)

    @property
    def changes_per_min(self) -> float:
        return max(s.window_changes_per_min for s in self.summaries)

    @property
    def mean_window(self) -> float:
        return sum(s.mean_window_fraction for s in self.summaries) / len(self.summaries)


def candidates(model: RCModel, workload: Workload, config: TuneConfig):
    dev = workload.device
    share = dev.attention_w / max(dev.mlp_w + dev.attention_w, 1e-9)
    for margin, horizon, hold, up, levels in itertools.product(config.margins_c, config.horizons_s, config.min_holds_s,
                                                               config.up_margins_c, config.level_sets):
        yield PredictivePolicy(r_c_per_w=model.r_c_per_w, tau_s=model.tau_s, ambient_c=model.ambient_c, levels=levels,
                               margin_c=margin, horizon_s=horizon, min_hold_s=hold, up_margin_c=up,
                               idle_w=dev.idle_w, attention_share=share, default_trip_c=dev.trip_c,
                               budget=config.budget)


def tune(model: RCModel, workload: Workload, quality: QualityTable, config: TuneConfig = TuneConfig(),
         progress=None) -> tuple[Trial, list[Trial]]:
    """(best eligible trial, all trials). Raises InputError when no candidate avoids the trip point."""
    trials = []
    for policy in candidates(model, workload, config):
        devices = [RCModel(model.r_c_per_w * (1 + e), model.c_j_per_c, model.ambient_c) for e in config.r_errors]
        trials.append(Trial(policy, tuple(simulate(device, policy, workload, quality, seed=s).summary
                                          for s in config.seeds for device in devices)))
        if progress:
            progress(trials[-1])
    ok = [t for t in trials if t.crossings == 0 and t.changes_per_min <= config.max_changes_per_min]
    if not ok:
        raise InputError(f"tune: none of {len(trials)} candidates kept below the trip point with at most "
                         f"{config.max_changes_per_min:g} window changes/min; widen margins_c or add smaller levels")
    return max(ok, key=lambda t: (round(t.score, 4), round(t.mean_window, 3), -t.changes_per_min)), trials
