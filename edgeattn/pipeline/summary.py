"""What a pipeline run tells its user at the end: what ran and what was already up to date, a fidelity far
below what the recipe says to expect, and bundles whose manifests list problems.

A recipe may state the fidelity it expects in its `[pipeline]` table (`expect_cos_mean` for encoders: the
mean embedding cosine to the float model; `expect_ppl_increase_pct` for decoders); a stage that measured
fidelity and lands far below it gets a warning, so a short run is never mistaken for the documented one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from edgeattn.pipeline.state import StageRecord

EXPECT_KEYS = ("expect_cos_mean", "expect_ppl_increase_pct")
FAR_COSINE = 0.02  # a mean cosine this far below the expected one is "far below"
FAR_PPL_POINTS = 10.0  # a perplexity increase this many percentage points above the expected one


def run_line(name: str, ran: Iterable[str], up_to_date: Iterable[str], skipped: Iterable[str], work_dir) -> str:
    """'NAME: ran 4 stages, 1 up to date, 1 skipped, in DIR' (a rerun that did nothing: 'ran 0 stages, ...')."""
    ran, fresh, skipped = list(ran), list(up_to_date), list(skipped)
    parts = [f"ran {len(ran)} stage{'' if len(ran) == 1 else 's'}", f"{len(fresh)} up to date"]
    if skipped:
        parts.append(f"{len(skipped)} skipped")
    return f"{name}: {', '.join(parts)}, in {work_dir}"


def fidelity_warnings(expect: Mapping[str, float], records: Mapping[str, StageRecord], recipe_name: str) -> list[str]:
    """One warning per stage whose measured fidelity is far below what the recipe expects."""
    out = []
    for stage, record in records.items():
        measured = (record.summary or {}).get("fidelity") or {}
        why = far_below(expect, measured)
        if why:
            out.append(f"stage {stage!r}: {why}; the recipe {recipe_name} expects it from its documented run "
                       f"(see the recipe's comments for the settings and time that give it)")
    return out


def far_below(expect: Mapping[str, float], measured: Mapping) -> str | None:
    """Why `measured` (a fidelity section) is far below `expect`, or None when it is not (or cannot be told)."""
    cos = measured.get("cos_mean")
    if cos is not None and "expect_cos_mean" in expect and cos < expect["expect_cos_mean"] - FAR_COSINE:
        return f"mean embedding cosine {cos:.4f} is far below the expected {expect['expect_cos_mean']:g}"
    ppl = measured.get("ppl_increase_pct")
    limit = expect.get("expect_ppl_increase_pct")
    if ppl is not None and limit is not None and ppl > limit + FAR_PPL_POINTS:
        return f"perplexity increase {ppl:+.1f}% is far above the expected {limit:+g}%"
    return None


def problem_lines(records: Mapping[str, StageRecord], bundles: Mapping[str, object]) -> list[str]:
    """One line per built bundle whose manifest lists problems."""
    out = []
    for stage, path in bundles.items():
        count = ((records.get(stage) and records[stage].summary) or {}).get("problems")
        if count:
            out.append(f"stage {stage!r}: the bundle lists {count} problem{'' if count == 1 else 's'} "
                       f"(edgeattn inspect {path})")
    return out
