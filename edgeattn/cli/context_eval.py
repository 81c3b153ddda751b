"""What `edgeattn eval BUNDLE --task` and `edgeattn eval-table` share: their options, the attention setting from
--window / --budget, opening the bundle, and the lines they print."""

from __future__ import annotations

import click


def run_options(f):
    """Options of every long-context run: samples, seed, answer length, the ring and the threads."""
    for option in reversed((
        click.option("--samples", default=50, show_default=True, help="Samples per task and context."),
        click.option("--seed", default=0, show_default=True, help="Seed of the task generators."),
        click.option("--max-tokens", type=int, help="New tokens generated [default: the task's: passkey 12, "
                                                    "multikey 16, vartrack 32]."),
        click.option("--prompt-form", type=click.Choice(["raw", "chat"]),
                     help="raw: a plain completion ending with an answer prefix; chat: one user message in the "
                          "chat template [default: the task's: passkey raw, multikey chat, vartrack chat]."),
        click.option("--budget-recent", default=0.25, show_default=True,
                     help="Share of a --budget's non-sink rows given to the recent window (the rest: pages)."),
        click.option("--prompt-attention", type=click.Choice(["budget", "whole"]), default="budget",
                     show_default=True,
                     help="What the prompt reads under a window or budget: the same rows as the generated tokens "
                          "(budget), or every cached row (whole: the setting bounds the generated tokens only)."),
        click.option("--window-max", type=int, help="Ring size to allocate [default: the bundle's]; the ring must "
                                                    "hold the whole context."),
        click.option("--threads", default=0, help="ONNX Runtime threads (0 = its default)."),
    )):
        f = option(f)
    return f


def context_options(f):
    """`edgeattn eval BUNDLE --task`'s own options, then the shared ones."""
    f = click.option("--json", "json_out", type=click.Path(dir_okay=False),
                     help="Also write the result and every sample's answer to this JSON file.")(f)
    f = run_options(f)
    for option in reversed((
        click.option("--task", help="Long-context task: passkey, multikey or vartrack."),
        click.option("--context", type=int, help="Context in tokens: the prompt (as the model reads it) plus "
                                                 "the answer."),
        click.option("--window", type=int, help="Attention window W: the sinks and the last W tokens."),
        click.option("--budget", type=int, help="Attention budget N rows: the sinks, a recent window and the "
                                                "retrieved pages that score highest."),
    )):
        f = option(f)
    return f


def setting_from(window: int | None, budget: int | None, recent: float, prompt: str = "budget"):
    from edgeattn.errors import InputError
    from edgeattn.evaluation.settings import DEFAULT_RECENT, AttentionSetting

    if window is not None and budget is not None:
        raise InputError("expected at most one of --window and --budget, found both")
    if budget is not None:
        return AttentionSetting("budget", budget, recent, prompt)
    if recent != DEFAULT_RECENT:
        raise InputError("--budget-recent applies to --budget N, found no --budget")
    if not window and prompt != "budget":
        raise InputError("--prompt-attention applies to a --window or --budget, found full attention")
    return AttentionSetting("window", window, prompt=prompt) if window else AttentionSetting()


def open_generator(bundle, window_max: int | None, threads: int):
    from edgeattn.runtime.generation.generator import Generator

    return Generator.open(bundle, window_max=window_max, threads=threads)


def render(result, gen) -> str:
    """accuracy, then the run's settings: what `edgeattn eval BUNDLE --task` prints."""
    layout = gen.model.layout
    return (f"{result.task} at {result.context} tokens, {result.setting.label} ({result.rows} rows read of "
            f"{result.context}; sinks {layout.sinks}, ring {layout.window_max}): accuracy {result.accuracy:.2f} "
            f"({result.correct}/{len(result.samples)} samples, seed {result.seed}, {result.max_tokens} new tokens, "
            f"{result.seconds:.1f} s)")
