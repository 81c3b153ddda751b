"""A decoder bundle opened for generation: its geometry, its text codec and one step of the model (a
`DecoderBackend`, backend.py, which the decode engine drives).

`step` runs a chunk for some streams of a KVCache: it feeds the cache buffers as they are (views, no copy,
when the streams are consecutive), writes the chunk's keys and values into the ring in place, and returns
the logits."""

from __future__ import annotations

import json

import numpy as np

from edgeattn.attention.ring import RingLayout
from edgeattn.attention.budget import AttentionBudget
from edgeattn.decoder.metadata import (GENERATION_FILE, LOGITS_TO_KEEP, PAGES_INPUT, TOKENIZER_FILE, bounds_names,
                                       past_names, present_names)
from edgeattn.errors import BundleError, ConfigError, InputError
from edgeattn.runtime.generation.cache import KVCache
from edgeattn.runtime.generation.fast_path import eligible
from edgeattn.runtime.generation.text import TextCodec



class DecoderModel:
    """Lifecycle as the backends': created light, `activate()` loads the model, `deactivate()` frees it."""

    def __init__(self, bundle, *, window_max: int | None = None, threads: int = 0) -> None:
        info = bundle.manifest.sections.get("decoder")
        if not info:
            inputs = ", ".join(s.name for s in bundle.manifest.inputs)
            raise BundleError(f"{bundle.path}: expected a decoder bundle (built from `edgeattn export MODEL "
                              f"--decoder`), found one with inputs {inputs}")
        self.bundle, self.info, self.threads = bundle, info, threads
        self.layout = RingLayout(int(info["sinks"]), int(window_max or info["window_max"]))
        generation = json.loads(bundle.file(GENERATION_FILE).read_text(encoding="utf-8")) \
            if bundle.file(GENERATION_FILE).is_file() else {}
        self.codec = TextCodec.from_files(bundle.file(TOKENIZER_FILE), generation)
        self.eos = set(int(t) for t in info.get("eos_token_ids", []))
        self.vocab_size = int(info["vocab_size"])
        self.layers = int(info["layers"])
        self._past, self._present = past_names(self.layers), present_names(self.layers)
        self.page = int(info.get("page") or 0)  # rows per retrieval page; 0: a model that reads the window only
        if self.page:
            self.layout.check_page(self.page)
        self._bounds = bounds_names(self.layers) if self.page else []
        self.backend = None
        self._keeps_logits = False
        self._linear = None  # the bundle's linear model (linear_path), opened at the first step that can use it
        self.fast_path = bool(info.get("fast_path_model"))
        self.fast_path_positions = int(info.get("fast_path_positions") or 0)  # 0: no end but the window's

    def activate(self) -> "DecoderModel":
        from edgeattn.runtime.backends import open_backend

        if self.backend is None:
            self.backend = open_backend(self.bundle, threads=self.threads)
            self.backend.activate()
            self._keeps_logits = LOGITS_TO_KEEP in (self.backend.input_names +
                                                    list(getattr(self.backend, "optional_input_names", [])))
        return self

    def deactivate(self) -> None:
        if self.backend is not None:
            self.backend.deactivate()
            self.backend = None
        self._linear = None

    def _linear_path(self):
        if self._linear is None:
            from edgeattn.runtime.generation.fast_path import FastPath

            self._linear = FastPath(self.bundle.file(self.info["fast_path_model"]), threads=self.threads,
                                      past=self._past, present=self._present)
        return self._linear

    def new_cache(self, streams: int = 1) -> KVCache:
        return KVCache(layers=self.layers, kv_heads=int(self.info["kv_heads"]), head_dim=int(self.info["head_dim"]),
                       layout=self.layout, streams=streams, page=self.page)

    def check_window(self, window: int) -> int:
        return self.layout.check_window(window)

    def check_pages(self, pages) -> int:
        """Retrieval pages k as an int: 0 always; k > 0 only for a model that reads key bounds."""
        if isinstance(pages, bool) or not isinstance(pages, (int, np.integer)) or int(pages) < 0:
            raise ConfigError(f"pages: expected an integer >= 0, found {pages!r}")
        if pages and not self.page:
            raise ConfigError(f"attention budget: expected a decoder bundle whose model reads retrieval pages "
                              f"(inputs {PAGES_INPUT} and key_bounds.*), found one without them (exported before "
                              f"the attention budget, or without a page size): run it with pages 0 (a window), or "
                              f"export it again with DecoderExportConfig(page=16)")
        return int(pages)

    def check_budget(self, budget: AttentionBudget) -> AttentionBudget:
        """A budget this model runs as given (window, pages, and this model's page size), else ConfigError."""
        self.check_window(budget.window)
        if self.check_pages(budget.pages) and budget.page != self.page:
            raise ConfigError(f"attention budget: expected pages of {self.page} rows (the model's key bounds), "
                              f"found {budget.page}")
        return budget

    def check_cache(self, cache: KVCache) -> None:
        want = (int(self.info["kv_heads"]), self.layout.capacity, int(self.info["head_dim"]))
        found = cache.keys[0].shape[1:] if cache.keys else None
        if len(cache.keys) != self.layers or found != want or cache.layout != self.layout:
            raise ConfigError(f"cache: expected {self.layers} layers of [B, {want[0]}, {want[1]}, {want[2]}] with "
                              f"sinks {self.layout.sinks}, found {len(cache.keys)} layers of "
                              f"{list(found) if found else 'nothing'} ({cache.layout})")

    def step(self, cache: KVCache, streams: list[int], ids: np.ndarray, window: int, *,
             last_only: bool = False, pages: int = 0) -> np.ndarray:
        """ids: [len(streams), S] -> logits [len(streams), S, V]; the streams advance by S tokens.

        `last_only`: logits of the chunk's last position only, [len(streams), 1, V]; a bundle built with the
        `logits-to-keep` input then runs its LM head for that position alone. `pages`: the attention budget's
        retrieval pages k beyond the window (a model exported with a page size; `check_pages`)."""
        if self.backend is None:
            raise BundleError("decoder is not active: call activate() first")
        if not len(streams):
            raise InputError("streams: expected at least one stream of the cache, found none")
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[0] != len(streams) or ids.shape[1] < 1:
            raise InputError(f"ids: expected [{len(streams)}, S >= 1], found {list(ids.shape)}")
        if ids.shape[1] > self.layout.window_max:
            raise InputError(f"a chunk of {ids.shape[1]} tokens: expected at most the ring's {self.layout.window_max}")
        low, high = (int(ids[0, 0]),) * 2 if ids.size == 1 else (int(ids.min()), int(ids.max()))  # a decode step: one id
        if low < 0 or high >= self.vocab_size:
            raise InputError(f"token ids: expected 0 to {self.vocab_size - 1}, found {low}..{high}")
        consecutive = len(streams) == 1 or list(streams) == list(range(streams[0], streams[0] + len(streams)))
        index = slice(streams[0], streams[0] + len(streams)) if consecutive else np.asarray(streams)
        window, pages = self.check_window(window), self.check_pages(pages)
        if self.fast_path and consecutive and eligible(self.layout.sinks, self.layout.window_max,
                                                       cache.positions[index], ids.shape[1], window,
                                                       self.fast_path_positions):
            # inside the window no past row is a page candidate: pages change nothing here
            before = cache.positions[index].copy()
            logits = self._linear_path().step(cache, streams[0], ids, window, last_only)
            for stream, start in zip(streams, before) if self.page else ():
                cache.update_bounds(stream, int(start), ids.shape[1])  # the fast path wrote rows, not bounds
            return logits[:, -1:] if last_only else logits
        feeds = {"input_ids": ids, "cache_position": cache.positions[index].copy(),
                 "attention_window": np.array(window, dtype=np.int64)}
        feeds.update(zip(self._past, cache.past(index)))
        if self.page:
            feeds[PAGES_INPUT] = np.array(pages, dtype=np.int64)
            feeds.update(zip(self._bounds, cache.past_bounds(index)))
        if self._keeps_logits:
            feeds[LOGITS_TO_KEEP] = np.array(1 if last_only else 0, dtype=np.int64)
        outs = self.backend.infer(feeds)
        cache.write([outs[n] for n in self._present], list(streams))
        logits = outs["logits"]
        return logits[:, -1:] if last_only else logits


# Backends other than ONNX Runtime / TensorRT, by the manifest's `backend`: "module:function(bundle, **options)".
# Named as strings so this layer does not import them (a GPU backend imports this one).
DECODER_OPENERS = {"cuda": "edgeattn.runtime.cuda.bundle:open_cuda_decoder"}


def open_decoder(bundle, *, window_max: int | None = None, threads: int = 0):
    """The engine's backend for a decoder bundle: DecoderModel, or the opener its manifest's backend names."""
    opener = DECODER_OPENERS.get(bundle.manifest.backend)
    if opener is None:
        return DecoderModel(bundle, window_max=window_max, threads=threads)
    import importlib

    module, name = opener.split(":")
    return getattr(importlib.import_module(module), name)(bundle, window_max=window_max)
