"""One evaluation run: a task's samples at one context, generated greedily with one attention setting.

A `chat` prompt goes in as `edgeattn generate --prompt` sends it: one user message in the bundle's chat template
(plain text when the tokenizer has none); a `raw` prompt goes in as plain text, ending with the answer prefix. The ring must hold the whole context: a longer prompt would be kept
head and tail by the engine (`fit_prompt`), dropping the middle where the needles are, and the score would
measure that eviction rather than the attention setting. So a context above the cache (sinks + window_max; open
the bundle with a larger `window_max`) or above the model's trained positions is refused before any work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from edgeattn.attention.ring import RingLayout
from edgeattn.errors import ConfigError
from edgeattn.evaluation.haystack import Counter
from edgeattn.evaluation.scoring import score
from edgeattn.evaluation.settings import AttentionSetting
from edgeattn.evaluation.tasks import Sample, check_form, get_task, make_samples
from edgeattn.quantize.progress import StepProgress
from edgeattn.runtime.generation.engine import budget_page, live_budget
from edgeattn.runtime.generation.generator import GenerationConfig, Generator

Progress = Callable[[object], None]  # a line of text or a StepProgress


@dataclass(frozen=True)
class EvalConfig:
    task: str
    context: int  # tokens: prompt + answer
    setting: AttentionSetting = field(default_factory=AttentionSetting)
    samples: int = 50
    seed: int = 0
    max_tokens: int | None = None  # new tokens; None: the task's default
    prefill_chunk: int = 256
    prompt_form: str | None = None  # chat or raw; None: the task's default

    def __post_init__(self) -> None:
        get_task(self.task)
        if self.prompt_form is not None:
            check_form(self.prompt_form)
        for name, low in (("context", 1), ("samples", 1), ("seed", 0), ("prefill_chunk", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name}: expected an integer >= {low}, found {value!r}")
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int)
                                            or self.max_tokens < 1):
            raise ConfigError(f"max_tokens: expected an integer >= 1, found {self.max_tokens!r}")

    @property
    def new_tokens(self) -> int:
        return get_task(self.task).max_tokens if self.max_tokens is None else self.max_tokens

    @property
    def form(self) -> str:
        return get_task(self.task).form if self.prompt_form is None else self.prompt_form


@dataclass(frozen=True)
class SampleResult:
    index: int
    depth: float
    prompt_tokens: int
    answers: tuple[str, ...]
    text: str
    correct: bool
    seconds: float


@dataclass(frozen=True)
class EvalResult:
    task: str
    context: int
    setting: AttentionSetting
    rows: int  # rows a query reads at most
    max_tokens: int
    seed: int
    samples: tuple[SampleResult, ...]
    seconds: float
    prompt_form: str = "chat"

    @property
    def correct(self) -> int:
        return sum(s.correct for s in self.samples)

    @property
    def accuracy(self) -> float:
        return self.correct / len(self.samples)

    def to_dict(self) -> dict:
        return {"task": self.task, "context": self.context, "setting": self.setting.to_dict(),
                "label": self.setting.label, "rows": self.rows, "max_tokens": self.max_tokens, "seed": self.seed,
                "prompt_form": self.prompt_form,
                "accuracy": self.accuracy, "correct": self.correct, "count": len(self.samples),
                "seconds": round(self.seconds, 2), "samples": [asdict(s) for s in self.samples]}


def as_prompt(gen: Generator, message: str, form: str = "chat"):
    """chat: what `edgeattn generate --prompt` sends, a user message when the tokenizer has a chat template;
    raw: the text as it is."""
    codec = gen.model.codec
    chat = form == "chat" and codec is not None and codec.chat_template
    return [{"role": "user", "content": message}] if chat else message


def prompt_counter(gen: Generator, form: str = "chat") -> Counter:
    if gen.model.codec is None:
        raise ConfigError("bundle: expected a decoder with a tokenizer (the tasks are text), found token ids only")
    return lambda message: len(gen.prompt_ids(as_prompt(gen, message, form)))


def check_context(gen: Generator, context: int) -> None:
    """A context the cache holds whole and the model was trained on, else ConfigError."""
    layout: RingLayout = gen.model.layout
    if context > layout.capacity:
        raise ConfigError(f"context: expected at most the cache's {layout.capacity} rows (sinks {layout.sinks} + "
                          f"ring {layout.window_max}), found {context}: a longer prompt is kept head and tail by "
                          f"the engine, dropping the needles; open a larger ring (--window-max)")
    trained = (getattr(gen.model, "info", None) or {}).get("max_positions")
    if trained and context > int(trained):
        raise ConfigError(f"context: expected at most the model's {trained} trained positions, found {context}")


def check_setting(gen: Generator, setting: AttentionSetting):
    """The live value the engine reads (window or AttentionBudget), checked against this bundle: a budget with
    pages needs a model that reads them (a bundle exported with a page size), which the engine checks."""
    live = setting.live(gen.model.layout, budget_page(gen.model))
    live_budget(gen.model, live)
    return live


def evaluate(gen: Generator, samples: list[Sample], setting: AttentionSetting, max_tokens: int, *,
             prefill_chunk: int = 256, progress: Progress | None = None) -> list[SampleResult]:
    """Generate greedily for every sample with `setting` and score each answer."""
    live = check_setting(gen, setting)
    config = GenerationConfig(max_tokens=max_tokens, prefill_chunk=prefill_chunk, prompt_attention=setting.prompt)
    task = f"{samples[0].task} {samples[0].context} {setting.label}" if samples else setting.label
    out, start = [], time.perf_counter()
    for sample in samples:
        began = time.perf_counter()
        result = gen.generate(as_prompt(gen, sample.message, sample.form), config, window=live)
        if result.evicted_prompt_tokens:  # check_context rules this out; a changed engine rule must not hide here
            raise ConfigError(f"sample {sample.index}: expected the whole prompt in the cache, found "
                              f"{result.evicted_prompt_tokens} tokens evicted")
        out.append(SampleResult(sample.index, round(sample.depth, 4), result.prompt_tokens, sample.answers,
                                result.text, score(sample.answers, result.text), time.perf_counter() - began))
        if progress is not None:
            progress(StepProgress(task, len(out), len(samples), time.perf_counter() - start, unit="sample"))
    return out


def run_eval(gen: Generator, config: EvalConfig, *, progress: Progress | None = None) -> EvalResult:
    """One task at one context with one setting, on an open Generator."""
    check_context(gen, config.context)
    check_setting(gen, config.setting)  # a bad setting fails before the prompts are made
    start = time.perf_counter()
    samples = make_samples(config.task, config.context, config.samples, prompt_counter(gen, config.form),
                           seed=config.seed, max_tokens=config.new_tokens, form=config.form)
    results = evaluate(gen, samples, config.setting, config.new_tokens, prefill_chunk=config.prefill_chunk,
                       progress=progress)
    rows = config.setting.rows(gen.model.layout, config.context, budget_page(gen.model))
    return EvalResult(config.task, config.context, config.setting, rows, config.new_tokens, config.seed,
                      tuple(results), time.perf_counter() - start, config.form)
