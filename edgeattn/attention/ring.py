"""The sinks + ring KV cache: one layout shared by the cached op's ONNX body, its references and the runtimes.

Per layer a buffer [B, H_kv, C, D] for keys and one for values, C = sinks + window_max. Rows [0, sinks) hold
the stream's first `sinks` tokens and are never overwritten; rows [sinks, C) are a ring: the token at
position p >= sinks lives in row sinks + (p - sinks) mod window_max. The ring therefore always holds the
last window_max tokens, so a live window W <= window_max can shrink and grow at run time exactly: it only
chooses how many ring rows are read. Memory is bounded by C however long the stream runs.

Positions (docs/windowed-attention.md, "Cached form"): keys are stored rotated at their true positions.
A query at position t reads window keys with q rotated at t (true distances, at most W), and sink keys with
q rotated at min(t, sinks + W): the distance to a sink is then at most sinks + W, as if the window sat right
after the sinks (StreamingLLM's positions within the cache), and no stored key is ever re-rotated. While
t <= sinks + W the two rotations agree, so a stream that fits in the cache is exact full attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeattn.errors import ConfigError


@dataclass(frozen=True)
class RingLayout:
    sinks: int
    window_max: int

    def __post_init__(self) -> None:
        if self.sinks < 0:
            raise ConfigError(f"sinks: expected >= 0, found {self.sinks}")
        if self.window_max < 1:
            raise ConfigError(f"window_max: expected >= 1, found {self.window_max}")

    @property
    def capacity(self) -> int:
        """Rows per layer: C = sinks + window_max."""
        return self.sinks + self.window_max

    def check_window(self, window) -> int:
        """A window a caller asks for, as an int: 0 (the whole ring) to window_max, else ConfigError."""
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)):
            raise ConfigError(f"window: expected an integer, found {window!r}")
        if not 0 <= int(window) <= self.window_max:
            raise ConfigError(f"window: expected 0 (the whole ring) to {self.window_max} (the ring's size), "
                              f"found {int(window)}")
        return int(window)

    def live_window(self, window: int) -> int:
        """The window the op uses: 0 (or anything above window_max) means window_max."""
        window = int(window)
        if window < 0:
            raise ConfigError(f"window: expected 0 (the largest) to {self.window_max}, found {window}")
        return self.window_max if window == 0 or window > self.window_max else window

    def check_page(self, page) -> int:
        """Rows per retrieval page (docs/windowed-attention.md, "The attention budget"): an integer >= 1 that
        divides window_max, else ConfigError."""
        if isinstance(page, bool) or not isinstance(page, (int, np.integer)) or int(page) < 1:
            raise ConfigError(f"page: expected a positive integer, found {page!r}")
        if self.window_max % int(page):
            raise ConfigError(f"page: expected a divisor of the ring's size {self.window_max}, found {int(page)}")
        return int(page)

    def page_count(self, page: int) -> int:
        """P = window_max / page: the ring's pages (sink rows are in none)."""
        return self.window_max // self.check_page(page)

    def page_of(self, rows: np.ndarray, page: int) -> np.ndarray:
        """Page of each cache row (int64 array of any shape): (row - sinks) // page, -1 for a sink row."""
        r = np.asarray(rows, dtype=np.int64)
        return np.where(r < self.sinks, -1, (r - self.sinks) // self.check_page(page))

    def slots(self, positions: np.ndarray) -> np.ndarray:
        """Row of each stream position (int64 array of any shape)."""
        p = np.asarray(positions, dtype=np.int64)
        return np.where(p < self.sinks, p, self.sinks + np.mod(p - self.sinks, self.window_max))

    def sink_positions(self, positions: np.ndarray, window: int) -> np.ndarray:
        """Where a query's second rotation puts it when it reads the sink rows: min(t, sinks + W)."""
        return np.minimum(np.asarray(positions, dtype=np.int64), self.sinks + self.live_window(window))

    def row_positions(self, cache_position: int) -> np.ndarray:
        """[C] the stream position each row holds after `cache_position` tokens, -1 where a row is empty."""
        rows = np.arange(self.capacity, dtype=np.int64)
        n = int(cache_position)
        out = np.where(rows < min(self.sinks, n), rows, -1)
        ring = rows[self.sinks:] - self.sinks  # residue r holds the latest p >= sinks with (p - sinks) % Wmax == r
        last = n - 1 - self.sinks  # offset of the newest ring token
        held = last - np.mod(last - ring, self.window_max)
        out[self.sinks:] = np.where((last >= 0) & (held >= 0), held + self.sinks, -1)
        return out
