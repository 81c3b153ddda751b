"""The generation API: prompt or chat in, text out (whole or streamed), on any decoder bundle.

    from edgeattn.runtime.generation.generator import Generator, GenerationConfig
    with Generator.open("smollm2.edgeattn") as g:
        result = g.generate("Write a haiku about heat.", GenerationConfig(max_tokens=64))
        for chunk in g.stream([{"role": "user", "content": "Hi"}], GenerationConfig(window=256)):
            print(chunk.text, end="")
        cheap = g.generate("Summarize: ...", GenerationConfig(budget=260))  # 260 rows: a window and pages

`Generator` is a one-slot client of the decode engine (edgeattn.runtime.generation.engine), the step the server
runs for many requests at once, so both give the same tokens. Prefill runs in chunks (never longer than the
ring), then one token per step. A prompt longer than the cache keeps its head (the sinks, or `pin` tokens) and
its tail; the result says how many tokens were evicted. The window may be a number or a function called before
every step (the thermal controller's live window; a value beyond the ring is the whole ring); either may also
give an `AttentionBudget` (a window and retrieval pages). `GenerationConfig.budget` is a total in rows, split
into a window and pages by `budget_recent` (`AttentionBudget.from_total`). The model is any
`DecoderBackend` (a bundle's `DecoderModel`, a cuda bundle's `CudaDecoder`, or `TorchDecoderModel`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from edgeattn.attention.budget import DEFAULT_RECENT, AttentionBudget
from edgeattn.errors import ConfigError, InputError
from edgeattn.runtime.generation.backend import DecoderBackend, preferred_chunk
from edgeattn.runtime.generation.decoder_bundle import open_decoder
from edgeattn.runtime.generation.engine import Engine, budget_page, check_prompt_attention, live_budget, new_job
from edgeattn.runtime.generation.sampling import SamplingConfig

Window = int | AttentionBudget | Callable[[], int | AttentionBudget]


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: tuple[str, ...] = ()
    window: int = 0  # 0 = the whole ring
    prefill_chunk: int = 0  # prompt tokens a prefill step; 0: the backend's own (256 on a CPU, 2,048 on CUDA)
    pin: int = 0  # prompt tokens kept from the head when the prompt is longer than the cache (at least the sinks)
    budget: int | None = None  # attention budget in rows (sinks + window + pages); None: the window alone
    budget_recent: float = DEFAULT_RECENT  # share of the budget's non-sink rows given to the recent window
    prompt_attention: str = "budget"  # what the prompt reads: "budget" (as generated tokens) or "whole" (the cache)

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ConfigError(f"max_tokens: expected an integer >= 1, found {self.max_tokens!r}")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise ConfigError(f"stop: expected non-empty strings, found {self.stop!r}")
        if self.prefill_chunk < 0 or self.pin < 0:
            raise ConfigError(f"expected prefill_chunk >= 0 and pin >= 0, found {self.prefill_chunk} and {self.pin}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ConfigError(f"window: expected an integer >= 0 (0 = the whole ring), found {self.window!r}")
        if self.budget is not None and self.window:
            raise ConfigError(f"expected a window or a budget, found both (window {self.window}, budget "
                              f"{self.budget!r}): a budget holds its own window")
        if isinstance(self.budget_recent, bool) or not isinstance(self.budget_recent, (int, float)) \
                or not 0.0 <= self.budget_recent <= 1.0:
            raise ConfigError(f"budget_recent: expected a fraction from 0 to 1, found {self.budget_recent!r}")
        check_prompt_attention(self.prompt_attention)


@dataclass(frozen=True)
class Chunk:
    text: str
    token: int | None
    window: int
    budget: int = 0  # rows read at most (sinks + window + pages x page)


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    finish_reason: str  # "stop" (end of text or a stop string) or "length"
    prompt_tokens: int
    evicted_prompt_tokens: int
    windows: list[int]
    prefill_s: float = 0.0
    decode_s: float = 0.0
    budgets: list[int] = field(default_factory=list)  # rows read at most for each token

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)


class Generator:
    """A one-slot client of the decode engine (engine.py): the same step the server's scheduler runs."""

    def __init__(self, model: DecoderBackend) -> None:
        self.model = model

    @classmethod
    def open(cls, bundle_path, *, window_max: int | None = None, threads: int = 0) -> "Generator":
        from edgeattn.bundle.folder import open_bundle

        return cls(open_decoder(open_bundle(bundle_path), window_max=window_max, threads=threads))

    def __enter__(self) -> "Generator":
        self.model.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.model.deactivate()

    def prompt_ids(self, prompt: str | list[dict] | list[int]) -> list[int]:
        codec = self.model.codec
        if isinstance(prompt, list) and prompt and all(isinstance(t, (int, np.integer)) for t in prompt):
            return [int(t) for t in prompt]
        if codec is None:
            raise InputError("prompt: this model has no tokenizer; give token ids")
        if isinstance(prompt, str):
            return codec.encode(prompt)
        if isinstance(prompt, list):
            return codec.encode(codec.render_chat(prompt))
        raise InputError(f"prompt: expected text, a list of chat messages or token ids, found {type(prompt).__name__}")

    def stream(self, prompt, config: GenerationConfig = GenerationConfig(), *, window: Window | None = None,
               result: GenerationResult | None = None) -> Iterator[Chunk]:
        """Yield text as it is generated; fills `result` (when given) as it goes."""
        model = self.model
        model.activate()
        if window is None:
            window = config.window if config.budget is None else \
                AttentionBudget.from_total(model.layout, config.budget, page=budget_page(model),
                                           recent=config.budget_recent)
        read = window if callable(window) else (lambda: window)
        first = read()  # a bad window or budget fails before any work
        model.check_window(first.window if isinstance(first, AttentionBudget) else first)
        live_budget(model, first)
        job = new_job(model.layout, self.prompt_ids(prompt), max_tokens=config.max_tokens, sampling=config.sampling,
                      stops=config.stop, pin=config.pin)
        res = result if result is not None else GenerationResult("", [], "length", 0, 0, [])
        res.prompt_tokens, res.evicted_prompt_tokens = job.prompt_tokens, job.evicted
        events: list = []
        engine = Engine(model, slots=1, prefill_chunk=config.prefill_chunk or preferred_chunk(model, 256), window=read,
                        deliver=events.extend, prompt_attention=config.prompt_attention)
        engine.add(job)
        while job.finish_reason is None:
            engine.step()
            engine.flush()
            for _, event in events:
                if event.tokens:
                    res.tokens.append(event.token)
                    res.windows.append(event.window)
                    res.budgets.append(event.budget)
                res.text += event.text
                if event.text:
                    yield Chunk(event.text, event.token, event.window, event.budget)
            events.clear()
        if job.error is not None:
            raise job.error
        res.finish_reason = job.finish_reason
        res.prefill_s = job.decoding_at - job.admitted_at
        res.decode_s = job.finished_at - job.decoding_at

    def generate(self, prompt, config: GenerationConfig = GenerationConfig(), *,
                 window: Window | None = None) -> GenerationResult:
        result = GenerationResult("", [], "length", 0, 0, [])
        for _ in self.stream(prompt, config, window=window, result=result):
            pass
        return result
