"""What the decode engine (edgeattn.runtime.generation.engine) asks of a model: the `DecoderBackend` protocol.

A backend owns the weights and the device; the engine owns the requests (slots, prefill chunks, sampling, stop
strings, the window). Two backends satisfy it today: `DecoderModel` (a decoder bundle on ONNX Runtime or
TensorRT, decoder_bundle.py) and `TorchDecoderModel` (a Hugging Face model on CUDA, torch_decoder.py); a new
device is a new backend, never a new loop.

- `layout`: the cache's geometry (`RingLayout`: sinks + a ring of `window_max` rows);
- `codec`: tokens <-> text (`TextCodec`), or None for a model that generates token ids only;
- `eos`: the end-of-text token ids; `vocab_size`: token ids are 0 .. vocab_size - 1;
- `activate()` / `deactivate()`: load / free the model (`activate` again is a no-op);
- `new_cache(streams)`: a cache of `streams` rows, a `StreamPositions` (`positions`, `held`, `reset`, `move`,
  `swap`);
- `check_window(w)`: w as an int when 0 (the whole ring) .. `window_max`, else ConfigError;
- `step(cache, streams, ids, window, last_only=)`: ids [len(streams), S] -> float logits [len(streams), S, V]
  ([len(streams), 1, V] with `last_only`); those streams advance by S.

A backend whose model reads retrieval pages beyond the window (the attention budget, `AttentionBudget`:
window W + k pages, docs/windowed-attention.md) is a `BudgetBackend`: its `step` (and `step_sample`, `prefill`
where it has them) takes the keyword `pages: int = 0` (k; 0 is the window alone, exactly as without it), `page`
says its rows per page, and `check_budget(budget)` returns a budget it runs as given, else ConfigError (a model
exported without key bounds refuses k > 0 and says what is missing).

The engine calls `step` with the decoding streams as consecutive rows from 0 (a backend may feed views of the
cache, or replay a captured graph per row count), with one stream for a prefill chunk, and always with
`last_only=True`.

A backend that prefills several streams in one call (`PrefillBackend`) offers
`prefill(cache, streams, chunks, window)`: `chunks` one 1-D int64 array per stream, of any lengths (a ragged
batch), returning float logits [len(streams), V] of each chunk's last position; every stream advances by its
chunk's length (when it raises, the engine puts their positions back). Its `prefill_tokens` says how many prompt
tokens the engine may hand it in one step (the engine's default per-step budget). The engine then prefills the
next chunk of every prefilling stream that fits the budget in one `prefill` call; without it, one chunk a step
through `step`. A sampling backend that prefills in batches offers `prefill_sample(cache, streams, chunks, window,
sampling)` too (`SamplingPrefillBackend`), returning int64 token ids [len(streams)].

A backend that also chooses the next token on its device (so only token ids cross to the host) offers
`step_sample(cache, streams, ids, window, sampling)`, with one `SamplingConfig` per stream, returning int64 token
ids [len(streams)] for each stream's last position; the engine then calls it, instead of `step` and its own
sampler, for every call whose tokens it needs (`SamplingBackend`). Such a backend owns the random state of
sampled streams: a seed's reproducibility is then the backend's promise.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from edgeattn.attention.budget import AttentionBudget
from edgeattn.attention.ring import RingLayout
from edgeattn.runtime.generation.cache import StreamPositions
from edgeattn.runtime.generation.sampling import SamplingConfig
from edgeattn.runtime.generation.text import TextCodec


@runtime_checkable
class DecoderBackend(Protocol):
    layout: RingLayout
    codec: TextCodec | None
    eos: Collection[int]
    vocab_size: int

    def activate(self) -> object: ...

    def deactivate(self) -> None: ...

    def new_cache(self, streams: int = 1) -> StreamPositions: ...

    def check_window(self, window: int) -> int: ...

    def step(self, cache: StreamPositions, streams: list[int], ids: np.ndarray, window: int, *,
             last_only: bool = False) -> np.ndarray: ...


@runtime_checkable
class BudgetBackend(DecoderBackend, Protocol):
    page: int  # rows per retrieval page of the model's key bounds (0: it reads the window only)

    def check_budget(self, budget: AttentionBudget) -> AttentionBudget: ...

    def step(self, cache: StreamPositions, streams: list[int], ids: np.ndarray, window: int, *,
             last_only: bool = False, pages: int = 0) -> np.ndarray: ...


@runtime_checkable
class SamplingBackend(DecoderBackend, Protocol):
    def step_sample(self, cache: StreamPositions, streams: list[int], ids: np.ndarray, window: int,
                    sampling: Sequence[SamplingConfig]) -> np.ndarray: ...


@runtime_checkable
class PrefillBackend(DecoderBackend, Protocol):
    prefill_tokens: int

    def prefill(self, cache: StreamPositions, streams: list[int], chunks: Sequence[np.ndarray],
                window: int) -> np.ndarray: ...


@runtime_checkable
class SamplingPrefillBackend(SamplingBackend, PrefillBackend, Protocol):
    def prefill_sample(self, cache: StreamPositions, streams: list[int], chunks: Sequence[np.ndarray], window: int,
                       sampling: Sequence[SamplingConfig]) -> np.ndarray: ...


def preferred_chunk(model: DecoderBackend, default: int) -> int:
    """Prompt tokens a prefill chunk takes when the caller names none: the backend's `prefill_chunk` if it has
    one (a GPU backend, whose prefill pass costs about the same for thousands of tokens), else `default`."""
    return int(getattr(model, "prefill_chunk", 0) or default)
