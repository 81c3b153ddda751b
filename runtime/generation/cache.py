"""The KV cache of a decoder bundle on the host: per layer one [B, H_kv, C, D] buffer for keys and one for
values (C = sinks + ring), one row of B per stream, written in place (edgeattn.attention.ring).

With the attention budget (a bundle whose model reads retrieval pages, docs/windowed-attention.md) it also
keeps per layer the key bounds [B, H_kv, P, 2, D] of the ring's pages: every write recomputes the pages it
touched from their filled rows (`update_bounds`), so they stay right when the ring overwrites a page row by row."""

from __future__ import annotations

import numpy as np

from edgeattn.attention.ring import RingLayout
from edgeattn.errors import ConfigError


class StreamPositions:
    """What every cache (host or device) knows of its streams: `positions` [streams], tokens seen by each, and
    per layer a key and a value buffer [streams, H_kv, C, D] (numpy or torch: rows are copied by indexing)."""

    layout: RingLayout
    positions: np.ndarray
    keys: list
    values: list

    @property
    def streams(self) -> int:
        return self.positions.shape[0]

    def held(self, stream: int) -> int:
        """Tokens of a stream whose keys are still in the cache (sinks + ring rows in use)."""
        n = int(self.positions[stream])
        return min(n, self.layout.sinks) + min(max(n - self.layout.sinks, 0), self.layout.window_max)

    def evicted(self, stream: int) -> int:
        return int(self.positions[stream]) - self.held(stream)

    def reset(self, stream: int) -> None:
        """Forget a stream (its rows are overwritten as the next one fills them; nothing is read before then)."""
        self.positions[stream] = 0

    def move(self, src: int, dst: int) -> None:
        """Copy a stream's rows (the filled part only) and position into another stream; forget the source."""
        filled = min(int(self.positions[src]), self.layout.capacity)
        for layer in self.keys + self.values:
            layer[dst, :, :filled] = layer[src, :, :filled]
        self.positions[dst] = self.positions[src]
        self.positions[src] = 0

    def swap(self, a: int, b: int) -> None:
        """Exchange two streams' rows and positions."""
        for layer in self.keys + self.values:
            layer[[a, b]] = layer[[b, a]]
        self.positions[[a, b]] = self.positions[[b, a]]


class KVCache(StreamPositions):
    def __init__(self, *, layers: int, kv_heads: int, head_dim: int, layout: RingLayout, streams: int = 1,
                 dtype: str = "float32", page: int = 0) -> None:
        """page > 0: also keep the key bounds of pages of `page` ring rows (`bounds`, one [B, H_kv, P, 2, D] a layer)."""
        if streams < 1:
            raise ConfigError(f"streams: expected >= 1, found {streams}")
        self.layout = layout
        self.page = layout.check_page(page) if page else 0
        shape = (layers, streams, kv_heads, layout.capacity, head_dim)
        self._keys, self._values = np.zeros(shape, dtype=dtype), np.zeros(shape, dtype=dtype)  # all layers at once
        self.keys, self.values = list(self._keys), list(self._values)  # a view per layer
        self._bounds = np.empty((layers, streams, kv_heads, layout.page_count(page) if page else 0, 2, head_dim),
                                dtype=dtype)
        self._bounds[..., 0, :], self._bounds[..., 1, :] = np.inf, -np.inf  # empty pages: never chosen
        self.bounds = list(self._bounds)
        self.positions = np.zeros(streams, dtype=np.int64)  # tokens seen by each stream
        self.bindings: dict = {}  # a runtime's handles on these buffers (the linear path's IO bindings)

    def __deepcopy__(self, memo) -> "KVCache":
        """A copy of the buffers and positions (the layer lists are views of the copies; no runtime bindings)."""
        other = object.__new__(KVCache)
        other.layout, other.page, other.positions, other.bindings = self.layout, self.page, self.positions.copy(), {}
        other._keys, other._values, other._bounds = self._keys.copy(), self._values.copy(), self._bounds.copy()
        other.keys, other.values, other.bounds = list(other._keys), list(other._values), list(other._bounds)
        return other

    def reset(self, stream: int) -> None:
        super().reset(stream)
        self._bounds[:, stream, ..., 0, :], self._bounds[:, stream, ..., 1, :] = np.inf, -np.inf

    def move(self, src: int, dst: int) -> None:
        self._bounds[:, dst] = self._bounds[:, src]
        super().move(src, dst)
        self.reset(src)

    def swap(self, a: int, b: int) -> None:
        self._bounds[:, [a, b]] = self._bounds[:, [b, a]]
        super().swap(a, b)

    def past_bounds(self, streams: slice | np.ndarray) -> list[np.ndarray]:
        """The key bounds of some streams, layer by layer (views when `streams` is a slice)."""
        return [b[streams] for b in self.bounds]

    def update_bounds(self, stream: int, start: int, count: int) -> None:
        """Recompute, in every layer, the bounds of the pages that positions start .. start + count - 1 of a
        stream were written to, from each page's filled rows (the stream's position is already past them)."""
        if not self.page:
            return
        sinks, page = self.layout.sinks, self.page
        ring = np.arange(max(start, sinks), start + count)
        filled = min(max(int(self.positions[stream]) - sinks, 0), self.layout.window_max)  # ring rows in use
        for j in np.unique((self.layout.slots(ring) - sinks) // page):
            rows = slice(sinks + j * page, sinks + min((j + 1) * page, filled))
            keys = self._keys[:, stream, :, rows]  # [layers, H_kv, filled rows of the page, D]
            self._bounds[:, stream, :, j, 0] = keys.min(axis=2)
            self._bounds[:, stream, :, j, 1] = keys.max(axis=2)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys + self.values)

    def past(self, streams: slice | np.ndarray) -> list[np.ndarray]:
        """The buffers of some streams, layer by layer, key then value (views when `streams` is a slice)."""
        out = []
        for k, v in zip(self.keys, self.values):
            out += [k[streams], v[streams]]
        return out

    def write(self, presents: list[np.ndarray], streams: list[int]) -> None:
        """presents: [key, value] per layer, [len(streams), H_kv, S, D]; advances those streams by S."""
        s = presents[0].shape[2]
        if s > self.layout.window_max:
            raise ConfigError(f"a chunk of {s} tokens is longer than the ring ({self.layout.window_max} rows)")
        if s == 1 and len(set(streams)) == len(streams):  # decode steps: one assignment for all layers and streams
            rows = np.asarray(streams, dtype=np.int64)
            slots = self.layout.slots(self.positions[rows])
            for buffer, new in ((self._keys, presents[0::2]), (self._values, presents[1::2])):
                buffer[:, rows, :, slots] = np.stack([p[:, :, 0] for p in new], axis=1)  # [B, layers, H_kv, D]
            self.positions[rows] += 1
            for stream in streams if self.page else ():
                self.update_bounds(stream, int(self.positions[stream]) - 1, 1)
            return
        for row, stream in enumerate(streams):
            n = int(self.positions[stream])
            slots = self.layout.slots(np.arange(n, n + s))
            for buffer, new in ((self._keys, presents[0::2]), (self._values, presents[1::2])):
                buffer[:, stream][:, :, slots] = np.stack([p[row] for p in new])  # [layers, H_kv, S, D]
            self.positions[stream] = n + s
            self.update_bounds(stream, n, s)
