"""The page-choice grid as a table and a plot: full attention, the window and the budget's page rules at every
budget of `page_choice.py --divisors`, per task and context.

    .venv/bin/python benchmarks/page_choice_table.py benchmarks/results/page_choice_*_grid.json \
        --plot docs/images/page_choice_grid.png

Prints one markdown table per task (a row per context; columns full, then window / centre / exact per budget
as a share of the context, with the share of full attention's accuracy beside the rules). `--plot` draws
accuracy against rows read per query, one panel per context (the `edgeattn eval-table` plot: full attention
dashed, the window and the budget's ranking of pages by the centre of their key bounds).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(paths: list[Path]) -> list[dict]:
    runs = [json.loads(Path(p).read_text()) for p in paths]
    for run in runs:
        if "budgets" not in run:
            raise SystemExit(f"{run.get('task')} at {run.get('context')}: expected a grid (page_choice.py --divisors)")
    return sorted(runs, key=lambda r: (r["task"], r["context"]))


def table(runs: list[dict], rules: tuple[str, ...]) -> str:
    lines = []
    for task in sorted({r["task"] for r in runs}):
        here = [r for r in runs if r["task"] == task]
        shares = sorted({r["context"] // b for r in here for b in r["budgets"]})
        head = ["context", "samples", "full"] + [f"{rule} 1/{s}" for s in shares for rule in rules]
        lines += [f"**{task}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in here:
            acc, full = r["accuracy"], r["accuracy"].get("full")
            cells = [f"{r['context']:,}", str(len(r["samples"])), f"{full:.2f}" if full is not None else ""]
            for s in shares:
                budget = r["context"] // s
                for rule in rules:
                    a = acc.get(f"{rule}@{budget}")
                    if a is None:
                        cells.append("")
                    elif rule == "window" or not full:
                        cells.append(f"{a:.2f}")
                    else:
                        cells.append(f"{a:.2f} ({100 * a / full:.0f}%)")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot_rows(runs: list[dict]) -> list[dict]:
    """The runs as `edgeattn eval-table` rows (edgeattn.evaluation.sweep.plot_results): the centre rule is the
    budget's."""
    rows = []
    for r in runs:
        for mode in r["modes"]:
            kind = {"full": "full", "window": "window", "centre": "budget"}.get(mode["rule"])
            if kind:
                rows.append({"task": r["task"], "context": r["context"], "rows": mode["budget"] if kind != "full"
                             else r["context"], "accuracy": r["accuracy"][mode["label"]],
                             "setting": {"kind": kind, "prompt": "budget"}})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--rules", default="window,centre,exact")
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args()
    runs = load(args.files)
    print(table(runs, tuple(args.rules.split(","))))
    if args.plot:
        from edgeattn.evaluation.sweep import plot_results

        plot_results(plot_rows(runs), args.plot, title="SmolLM2-135M-Instruct, prompt read whole, 50 samples a point")
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
