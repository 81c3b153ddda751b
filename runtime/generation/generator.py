"""The generation API: prompt or chat in, text out (whole or streamed), on any decoder bundle.

    from edgeattn.runtime.generation.generator import Generator, GenerationConfig
    with Generator.open("smollm2.edgeattn") as g:
        result = g.generate("Write a haiku about heat.", GenerationConfig(max_tokens=64))
        for chunk in g.stream([{"role": "user", "content": "Hi"}], GenerationConfig(window=256)):
            print(chunk.text, end="")

Prefill runs in chunks (never longer than the ring), then one token per step. A prompt longer than the cache
keeps its head (the sinks, or `pin` tokens) and its tail; the result says how many tokens were evicted.
The window may be a number or a function called before every step (the thermal controller's live window).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from edgeattn.errors import ConfigError, InputError
from edgeattn.runtime.generation.cache import KVCache
from edgeattn.runtime.generation.decoder_bundle import DecoderModel
from edgeattn.runtime.generation.sampling import Sampler, SamplingConfig
from edgeattn.runtime.generation.text import TextStream

Window = int | Callable[[], int]


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: tuple[str, ...] = ()
    window: int = 0  # 0 = the whole ring
    prefill_chunk: int = 256
    pin: int = 0  # prompt tokens kept from the head when the prompt is longer than the cache (at least the sinks)

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ConfigError(f"max_tokens: expected an integer >= 1, found {self.max_tokens!r}")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise ConfigError(f"stop: expected non-empty strings, found {self.stop!r}")
        if self.prefill_chunk < 1 or self.pin < 0:
            raise ConfigError(f"expected prefill_chunk >= 1 and pin >= 0, found {self.prefill_chunk} and {self.pin}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ConfigError(f"window: expected an integer >= 0 (0 = the whole ring), found {self.window!r}")


@dataclass(frozen=True)
class Chunk:
    text: str
    token: int | None
    window: int


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

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)


def fit_prompt(ids: list[int], capacity: int, sinks: int, pin: int, reserve: int) -> tuple[list[int], int]:
    """Keep the head (max(sinks, pin) tokens) and the tail so the kept prompt plus `reserve` fits the cache."""
    budget = capacity - reserve
    if len(ids) <= budget:
        return ids, 0
    head = min(max(sinks, pin), budget // 2)
    tail = budget - head
    return ids[:head] + ids[len(ids) - tail:], len(ids) - head - tail


class Generator:
    def __init__(self, model: DecoderModel) -> None:
        self.model = model

    @classmethod
    def open(cls, bundle_path, *, window_max: int | None = None, threads: int = 0) -> "Generator":
        from edgeattn.bundle.folder import open_bundle

        return cls(DecoderModel(open_bundle(bundle_path), window_max=window_max, threads=threads))

    def __enter__(self) -> "Generator":
        self.model.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.model.deactivate()

    def prompt_ids(self, prompt: str | list[dict] | list[int]) -> list[int]:
        codec = self.model.codec
        if isinstance(prompt, str):
            return codec.encode(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(t, (int, np.integer)) for t in prompt):
            return [int(t) for t in prompt]
        if isinstance(prompt, list):
            return codec.encode(codec.render_chat(prompt))
        raise InputError(f"prompt: expected text, a list of chat messages or token ids, found {type(prompt).__name__}")

    def _window(self, window: Window, config: GenerationConfig) -> int:
        return self.model.check_window(window() if callable(window) else window)

    def prefill(self, ids: list[int], cache: KVCache, stream: int, config: GenerationConfig,
                window: Window) -> np.ndarray:
        """Run the prompt in chunks; returns the last position's logits [V]."""
        layout = self.model.layout
        chunk = min(config.prefill_chunk, layout.window_max)
        logits, done = None, 0
        while done < len(ids):
            w = self._window(window, config)
            position = int(cache.positions[stream])
            # the op scores a chunk's own keys with q (true distances): a chunk holding sink positions ends by
            # t = sinks + W, where the sink rows' second rotation begins (docs/windowed-attention.md)
            size = chunk if position >= layout.sinks else min(chunk, layout.sinks + layout.live_window(w) - position)
            piece = np.asarray(ids[done:done + size], dtype=np.int64)[None]
            logits = self.model.step(cache, [stream], piece, w, last_only=True)[0, -1]
            done += piece.shape[1]
        return logits

    def stream(self, prompt, config: GenerationConfig = GenerationConfig(), *, window: Window | None = None,
               result: GenerationResult | None = None) -> Iterator[Chunk]:
        """Yield text as it is generated; fills `result` (when given) as it goes."""
        model = self.model
        if model.backend is None:
            model.activate()
        window = config.window if window is None else window
        self._window(window, config)  # a bad window fails before any work
        sampler = Sampler(config.sampling)
        ids = self.prompt_ids(prompt)
        if not ids:
            raise InputError("prompt: expected at least one token, found an empty prompt")
        kept, evicted = fit_prompt(ids, model.layout.capacity, model.layout.sinks, config.pin,
                                   reserve=min(config.max_tokens, model.layout.window_max // 2))
        res = result if result is not None else GenerationResult("", [], "length", len(ids), evicted, [])
        res.prompt_tokens, res.evicted_prompt_tokens = len(ids), evicted
        cache = model.new_cache(1)
        t0 = time.perf_counter()
        logits = self.prefill(kept, cache, 0, config, window)
        res.prefill_s = time.perf_counter() - t0
        text_stream = TextStream(model.codec)
        text = ""
        t0 = time.perf_counter()
        for _ in range(config.max_tokens):
            token = sampler(logits)
            if token in model.eos:
                res.finish_reason = "stop"
                break
            res.tokens.append(token)
            piece = text_stream.push(token)
            w = self._window(window, config)
            res.windows.append(w)
            if piece:
                cut = _stop_cut(text, piece, config.stop)
                if cut is not None:
                    piece = piece[:cut]
                    text += piece
                    res.finish_reason = "stop"
                    if piece:
                        yield Chunk(piece, token, w)
                    break
                text += piece
                yield Chunk(piece, token, w)
            if len(res.tokens) == config.max_tokens:
                break
            logits = model.step(cache, [0], np.array([[token]], dtype=np.int64), w, last_only=True)[0, -1]
        else:
            pass
        if res.finish_reason != "stop":
            tail = text_stream.flush()
            if tail:
                text += tail
                yield Chunk(tail, None, res.windows[-1] if res.windows else 0)
        res.text = text
        res.decode_s = time.perf_counter() - t0

    def generate(self, prompt, config: GenerationConfig = GenerationConfig(), *,
                 window: Window | None = None) -> GenerationResult:
        result = GenerationResult("", [], "length", 0, 0, [])
        for _ in self.stream(prompt, config, window=window, result=result):
            pass
        return result


def _stop_cut(text: str, piece: str, stops: tuple[str, ...]) -> int | None:
    """Where in `piece` the first stop string ends the text (the stop string itself is not returned)."""
    if not stops:
        return None
    joined = text + piece
    best = None
    for s in stops:
        i = joined.find(s, max(0, len(text) - len(s) + 1))
        if i != -1 and (best is None or i < best):
            best = i
    return None if best is None else max(best - len(text), 0)
