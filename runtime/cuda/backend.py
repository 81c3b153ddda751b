"""`CudaDecoder`: the decode engine's backend on an NVIDIA GPU (edgeattn.runtime.generation.backend's
`SamplingBackend`): the cache lives on the device, a decode step is one CUDA graph replay per batch bucket, and
the next tokens are chosen on the device, so only token ids cross to the host.

Decode steps (one token for streams 0..n-1) replay a graph captured for the bucket (the next power of two >= n)
and the attention kernel's split count (sized from the live window); rows n..bucket-1 run along and are
ignored: they write the row their stream would write next, which that stream overwrites before reading it,
and their draw counters do not move. Prefill chunks run eagerly (prefill.py), the chunks of several streams in
one pass (`prefill` / `prefill_sample`: chunks of any lengths; the engine hands up to `prefill_tokens` tokens a
step). Sampling state (seed and draws so far) belongs to a cache row and moves with it, so a seeded stream draws
the same tokens whatever runs beside.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence

import numpy as np

from edgeattn.attention.ring import RingLayout
from edgeattn.errors import ConfigError, InputError
from edgeattn.optional import require
from edgeattn.runtime.cuda import budget as attention_budget
from edgeattn.runtime.cuda.decode_step import DecodeGraph, PackedDecoder
from edgeattn.runtime.cuda.prefill import prefill_batch
from edgeattn.runtime.cuda.sampling import DeviceSampling, sample
from edgeattn.runtime.generation.cache import StreamPositions


class CudaCache(StreamPositions):
    """Per layer [streams, H_kv, C, D] on the device; positions on the host; per-row sampling state."""

    def __init__(self, weights: PackedDecoder, streams: int) -> None:
        if streams < 1:
            raise ConfigError(f"streams: expected >= 1, found {streams}")
        s = weights.shape
        self.layout = RingLayout(s.sinks, s.window_max)
        self.keys, self.values = weights.new_cache(streams)
        self.positions = np.zeros(streams, dtype=np.int64)
        self.sampling = DeviceSampling.for_streams(streams, weights.device)
        self.seeds = np.array([self._fresh_seed() for _ in range(streams)], dtype=np.int64)
        self.settings: dict[int, tuple] = {}  # row -> the sampling settings last written to the device
        self.bounds, self.page = None, 0  # per layer page bounds, once a budget is asked for (budget.attach_bounds)

    @staticmethod
    def _fresh_seed() -> int:
        return int.from_bytes(os.urandom(7), "little")

    @property
    def sinks(self) -> list:
        """An FP8 cache's float sink buffers (fp8_cache.Layers), keys' then values', else []."""
        return [t for layers in (self.keys, self.values) for t in (getattr(layers, "sinks", None) or [])]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values + self.sinks)

    def reset(self, stream: int) -> None:
        super().reset(stream)
        self.seeds[stream] = self._fresh_seed()
        self.settings.pop(stream, None)

    def move(self, src: int, dst: int) -> None:
        attention_budget.move_bounds(self, src, dst)
        for t in self.sinks:
            t[dst] = t[src]
        super().move(src, dst)
        p = self.sampling
        for t in p.tensors:
            t[dst] = t[src]
        self.seeds[dst] = self.seeds[src]
        if src in self.settings:
            self.settings[dst] = self.settings[src]
        else:
            self.settings.pop(dst, None)
        self.reset(src)

    def swap(self, a: int, b: int) -> None:
        attention_budget.swap_bounds(self, a, b)
        for t in self.sinks:
            t[[a, b]] = t[[b, a]]
        super().swap(a, b)
        p = self.sampling
        for t in p.tensors:
            t[[a, b]] = t[[b, a]]
        self.seeds[[a, b]] = self.seeds[[b, a]]
        sa, sb = self.settings.pop(a, None), self.settings.pop(b, None)
        if sa is not None:
            self.settings[b] = sa
        if sb is not None:
            self.settings[a] = sb


PREFILL_CHUNK = 2048  # a pass of up to thousands of tokens costs about the same: few, long chunks


class CudaDecoder:
    """A Llama-family decoder on one GPU. `compile`: the decode step's torch.compile mode (decode_step).
    `prefill_tokens`: prompt tokens the engine prefills a step, in one pass (on an H200 a pass for a 135M model
    took about 37 ms, set by the host's kernel launches, for 2,048 to 16,384 tokens: 8 prompts of 2,048 take one
    step)."""

    def __init__(self, weights: PackedDecoder, codec=None, eos=(), *, compile: str = "auto",
                 info: dict | None = None, memory_check=None, prefill_tokens: int = 16384) -> None:
        self.torch = require("torch", "generation on CUDA")
        if prefill_tokens < 1:
            raise ConfigError(f"prefill_tokens: expected >= 1, found {prefill_tokens}")
        self.prefill_tokens = int(prefill_tokens)
        self.prefill_chunk = PREFILL_CHUNK  # a stream's chunk when the caller names none (backend.preferred_chunk)
        self.weights = weights
        self.info = dict(info or {})  # a bundle's decoder section (max_positions, sizes), as DecoderModel's
        self._memory_check = memory_check  # called with a cache's stream count before it is allocated
        s = weights.shape
        self.layout = RingLayout(s.sinks, s.window_max)
        self.codec, self.eos, self.vocab_size = codec, set(int(t) for t in eos), s.vocab
        self.compile = compile
        # per cache its captured graphs (bucket, splits, kind): they hold the cache's tensors, so they go with it
        self._graphs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        dev = weights.device
        self._sms = self.torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
        self.backend = self  # the engine checks `backend is None` before activating

    @classmethod
    def from_hf(cls, model, tokenizer=None, *, sinks: int = 4, window_max: int = 2048, **kw) -> "CudaDecoder":
        codec = None
        if tokenizer is not None:
            from edgeattn.runtime.generation.text import TextCodec

            codec = TextCodec(tokenizer.backend_tokenizer.to_str(), getattr(tokenizer, "chat_template", None),
                              {k: getattr(tokenizer, k) for k in ("bos_token", "eos_token") if getattr(tokenizer, k, None)})
        eos = model.config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        return cls(PackedDecoder.from_hf(model, sinks=sinks, window_max=window_max), codec, eos, **kw)

    # --- lifecycle -----------------------------------------------------------------------------------------
    def activate(self) -> "CudaDecoder":
        return self

    def deactivate(self) -> None:
        self._graphs.clear()

    def graphs_of(self, cache: CudaCache) -> dict:
        """The decode graphs captured over `cache`'s buffers (keyed by the cache object, never by its id: a new
        cache may take a freed one's id, and a graph must never write another cache's tensors)."""
        return self._graphs.setdefault(cache, {})

    def new_cache(self, streams: int = 1) -> CudaCache:
        if self._memory_check is not None:
            self._memory_check(streams)
        return CudaCache(self.weights, streams)

    def check_window(self, window: int) -> int:
        return self.layout.check_window(window)

    @property
    def page(self) -> int:
        """Rows per retrieval page of the attention budget (0: the ring does not cut into pages of 16)."""
        return attention_budget.DEFAULT_PAGE if self.layout.window_max % attention_budget.DEFAULT_PAGE == 0 else 0

    def check_budget(self, budget):
        return attention_budget.check_budget(self, budget)

    # --- steps -----------------------------------------------------------------------------------------------
    def step(self, cache: CudaCache, streams: list[int], ids, window: int, *, last_only: bool = False,
             pages: int = 0) -> np.ndarray:
        """ids [n, S] -> float32 logits on the host, [n, 1 or S, V]; the streams advance by S. pages: the attention
        budget's retrieved pages k beyond the window (0: the window alone)."""
        ids, window = self._check(cache, streams, ids, window)
        pages = attention_budget.check_pages(self, pages)
        n, length = ids.shape
        if self._is_decode(streams, ids):
            logits = self._decode(cache, n, ids[:, 0], window, None, pages)[:, None]
        else:
            logits = self._prefill_pages(cache, streams, ids.reshape(-1), [length] * n, window, last_only, pages)
            logits = logits.view(n, 1 if last_only else length, -1)
        self._advance(cache, streams, length)
        return logits.float().cpu().numpy()

    def prefill(self, cache: CudaCache, streams: list[int], chunks: Sequence, window: int, *,
                pages: int = 0) -> np.ndarray:
        """chunks: one 1-D array of token ids per stream, of any lengths -> float32 logits [n, V] of each chunk's
        last token, on the host; the streams advance by their chunks' lengths (none when it raises)."""
        ids, lengths, window = self._check_chunks(cache, streams, chunks, window)
        pages = attention_budget.check_pages(self, pages)
        logits = self._prefill_pages(cache, streams, ids, lengths, window, True, pages)
        self._advance(cache, streams, lengths)
        return logits.float().cpu().numpy()

    def prefill_sample(self, cache: CudaCache, streams: list[int], chunks: Sequence, window: int,
                       sampling: Sequence, *, pages: int = 0) -> np.ndarray:
        """prefill, then the next token of each stream chosen on the device: int64 [n]."""
        ids, lengths, window = self._check_chunks(cache, streams, chunks, window)
        if len(sampling) != len(streams):
            raise InputError(f"sampling: expected one setting per stream ({len(streams)}), found {len(sampling)}")
        if not all(c.greedy for c in sampling):
            self._set_sampling(cache, streams, sampling)
        pages = attention_budget.check_pages(self, pages)
        logits = self._prefill_pages(cache, streams, ids, lengths, window, True, pages)
        chosen = logits.argmax(dim=-1)
        for i, config in enumerate(sampling):
            if not config.greedy:
                r = streams[i]
                chosen[i:i + 1] = self._choose(logits[i:i + 1], cache, r, config, int(cache.positions[r]) + lengths[i])
        self._advance(cache, streams, lengths)
        return chosen.cpu().numpy()

    def step_sample(self, cache: CudaCache, streams: list[int], ids, window: int, sampling: Sequence, *,
                    pages: int = 0) -> np.ndarray:
        """ids [n, S] -> the next token of each stream, int64 [n], chosen on the device."""
        ids, window = self._check(cache, streams, ids, window)
        pages = attention_budget.check_pages(self, pages)
        if len(sampling) != len(streams):
            raise InputError(f"sampling: expected one setting per stream ({len(streams)}), found {len(sampling)}")
        greedy = all(c.greedy for c in sampling)
        if not greedy:
            self._set_sampling(cache, streams, sampling)
        n, length = ids.shape
        if self._is_decode(streams, ids):  # an all-greedy batch takes the argmax graph (no sort of the vocabulary)
            chosen = self._decode(cache, n, ids[:, 0], window, "greedy" if greedy else cache.sampling, pages)
        else:
            logits = self._prefill_pages(cache, streams, ids.reshape(-1), [length] * n, window, True, pages)
            chosen = self.torch.cat([self._choose(logits[i:i + 1], cache, r, sampling[i],
                                                  int(cache.positions[r]) + length) for i, r in enumerate(streams)])
        self._advance(cache, streams, length)
        return chosen.cpu().numpy()

    def _check(self, cache, streams, ids, window):
        ids = np.asarray(ids, dtype=np.int64)
        if not len(streams):
            raise InputError("streams: expected at least one stream of the cache, found none")
        if ids.ndim != 2 or ids.shape[0] != len(streams) or ids.shape[1] < 1:
            raise InputError(f"ids: expected [{len(streams)}, S >= 1], found {list(ids.shape)}")
        if ids.shape[1] > self.layout.window_max:
            raise InputError(f"a chunk of {ids.shape[1]} tokens: expected at most the ring's {self.layout.window_max}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise InputError(f"token ids: expected 0 to {self.vocab_size - 1}, found {int(ids.min())}..{int(ids.max())}")
        return ids, self.check_window(window)

    def _check_chunks(self, cache, streams, chunks, window):
        """(the chunks packed into one array, their lengths, the window) after checking them."""
        if not len(streams) or len(chunks) != len(streams):
            raise InputError(f"chunks: expected one chunk per stream ({len(streams)} streams, at least one), "
                             f"found {len(chunks)}")
        if len(set(streams)) != len(streams) or not all(0 <= r < cache.streams for r in streams):
            raise InputError(f"streams: expected distinct rows of the cache's {cache.streams}, found {list(streams)}")
        chunks = [np.asarray(c, dtype=np.int64) for c in chunks]
        for c in chunks:
            if c.ndim != 1 or not 1 <= c.shape[0] <= self.layout.window_max:
                raise InputError(f"a chunk: expected 1-D, 1 to {self.layout.window_max} tokens (the ring), "
                                 f"found shape {list(c.shape)}")
        ids = np.concatenate(chunks)
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise InputError(f"token ids: expected 0 to {self.vocab_size - 1}, found {int(ids.min())}..{int(ids.max())}")
        return ids, [c.shape[0] for c in chunks], self.check_window(window)

    @staticmethod
    def _is_decode(streams, ids) -> bool:
        return ids.shape[1] == 1 and list(streams) == list(range(len(streams)))

    @staticmethod
    def _advance(cache, streams, n) -> None:
        """Each stream's position moves by n (an int, or one length per stream)."""
        cache.positions[np.asarray(streams)] += np.asarray(n, dtype=np.int64)

    def _set_sampling(self, cache: CudaCache, streams, sampling) -> None:
        """Each row's settings on the device; rows whose settings did not change since the last call are left."""
        seeds = [c.seed if c.seed is not None else int(cache.seeds[r]) for c, r in zip(sampling, streams)]
        wanted = [(c.temperature, c.top_p, c.top_k, sd) for c, sd in zip(sampling, seeds)]
        changed = [i for i, (r, w) in enumerate(zip(streams, wanted)) if cache.settings.get(r) != w]
        if not changed:
            return
        for i in changed:
            cache.settings[streams[i]] = wanted[i]
        rows = np.asarray(streams)[changed]
        sampling = [sampling[i] for i in changed]
        seeds = [seeds[i] for i in changed]
        p, torch = cache.sampling, self.torch
        values = torch.tensor([[float(c.temperature), float(c.top_p)] for c in sampling])
        ints = torch.tensor([[int(c.top_k), int(sd) & ((1 << 62) - 1)] for c, sd in zip(sampling, seeds)])
        index = torch.as_tensor(rows, device=p.seeds.device)
        values, ints = values.to(p.seeds.device, non_blocking=True), ints.to(p.seeds.device, non_blocking=True)
        p.temperature[index], p.top_p[index] = values[:, 0], values[:, 1]
        p.top_k[index], p.seeds[index] = ints[:, 0], ints[:, 1]

    def _choose(self, logits, cache: CudaCache, row: int, config, position: int):
        """The next token after a prefill chunk: the argmax, or a draw at `position` with the row's settings."""
        if config.greedy:
            return logits.argmax(dim=-1)
        counters = self.torch.tensor([position], device=logits.device)
        return sample(logits, cache.sampling.rows(row, row + 1), counters)

    def _prefill(self, cache, streams, ids, lengths, window: int, last_only: bool):
        """ids: the chunks packed ([T], host) -> logits [n, V] (last_only) or [T, V] on the device."""
        ids = self.torch.as_tensor(ids, device=self.weights.device)
        starts = [int(cache.positions[r]) for r in streams]
        with self.torch.no_grad():
            return prefill_batch(self.weights, ids, lengths, starts, window, cache.keys, cache.values, list(streams),
                                 last_only=last_only)

    def _prefill_pages(self, cache, streams, ids, lengths, window: int, last_only: bool, pages: int):
        """_prefill, or with the attention budget (k > 0, or a cache that keeps page bounds) budget.prefill."""
        plain = lambda: self._prefill(cache, streams, ids, lengths, window, last_only)  # noqa: E731
        if pages or cache.bounds is not None:
            return attention_budget.prefill(self, cache, streams, ids, lengths, window, pages, last_only, plain)
        return plain()

    def _decode(self, cache: CudaCache, n: int, ids, window: int, sampling, pages: int = 0):
        if pages or cache.bounds is not None:  # the attention budget's step (budget.py)
            return attention_budget.decode(self, cache, n, ids, window, pages, sampling)
        from edgeattn.plugins.kernels.cached_decode import cached_decode_splits

        torch, s = self.torch, self.weights.shape
        bucket = min(1 << (n - 1).bit_length(), cache.streams)
        live = self.layout.live_window(window)
        longest = int(cache.positions[:n].max()) + 1
        keys = min(live, max(longest - s.sinks, 1))
        keys = min(1 << (keys - 1).bit_length(), live)  # a few split counts as streams grow
        splits = cached_decode_splits(bucket * s.kv_heads, s.sinks, keys, self._sms)
        kind = "logits" if sampling is None else "greedy" if isinstance(sampling, str) else "sampled"
        key = (bucket, splits, kind)
        graph = self.graphs_of(cache).get(key)
        if graph is None:
            graph = DecodeGraph(self.weights, cache.keys, cache.values, batch=bucket, splits=splits,
                                compile=self.compile if self.weights.device.type == "cuda" else "none",
                                greedy=kind == "greedy",
                                sampling=sampling.rows(0, bucket) if kind == "sampled" else None)
            self.graphs_of(cache)[key] = graph
        inputs = np.zeros((2, bucket), dtype=np.int64)  # ids (padded) and positions: one copy to the device
        inputs[0, :n] = ids
        inputs[1] = cache.positions[:bucket]
        inputs = torch.from_numpy(inputs).to(self.weights.device, non_blocking=True)
        with torch.no_grad():
            out = graph(inputs[0], inputs[1], window)
        return out[:n]
