"""The attention budget: how many cache rows a query reads, split between the recent window and retrieved pages.

A budget of N rows is sinks + W + k * page: the sink rows, the W most recent ring rows (the live window, as
before), and the k pages of `page` ring rows whose key bounds score highest for the query (Quest,
arXiv 2406.10774). The window alone is the case k = 0. `from_total` splits a total N: a `recent` share of
the non-sink rows goes to the window (rounded to whole pages, at least one page, never past N), the rest
to pages. Nothing is evicted by a smaller budget, so it can grow back at run time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgeattn.attention.ring import RingLayout
from edgeattn.errors import ConfigError

DEFAULT_PAGE = 16  # rows per retrieval page (Quest's page size)
DEFAULT_RECENT = 0.25  # share of the non-sink rows given to the recent window


def _is_integer(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def check_page(layout: RingLayout, page: int) -> int:
    """A page size that cuts the ring into whole pages, as an int, else ConfigError."""
    return layout.check_page(page)


@dataclass(frozen=True)
class AttentionBudget:
    window: int  # W: recent ring rows read (0 = the whole ring, only with pages == 0)
    pages: int  # k: retrieved pages read beyond the window
    page: int = DEFAULT_PAGE  # rows per page
    sinks: int = 0  # the layout's sink rows, always read

    def __post_init__(self) -> None:
        for name in ("window", "pages", "sinks"):
            value = getattr(self, name)
            if not _is_integer(value) or int(value) < 0:
                raise ConfigError(f"{name}: expected an integer >= 0, found {value!r}")
        if not _is_integer(self.page) or int(self.page) < 1:
            raise ConfigError(f"page: expected a positive integer, found {self.page!r}")

    @property
    def rows(self) -> int:
        """Rows a query reads at most: sinks + W + k * page."""
        return self.sinks + self.window + self.pages * self.page

    @classmethod
    def from_total(cls, layout: RingLayout, total: int, page: int = DEFAULT_PAGE,
                   recent: float = DEFAULT_RECENT) -> AttentionBudget:
        """Split a total of N rows: W = max(page, round_to_page(recent * (N - sinks))), k = (N - sinks - W) // page."""
        page = check_page(layout, page)
        if not _is_integer(total):
            raise ConfigError(f"attention budget: expected an integer number of rows, found {total!r}")
        total = int(total)
        lowest = layout.sinks + page
        if not lowest <= total <= layout.capacity:
            raise ConfigError(f"attention budget: expected {lowest} (sinks + one page) to {layout.capacity} "
                              f"(the cache's rows), found {total}")
        if isinstance(recent, bool) or not isinstance(recent, (int, float)) or not 0.0 <= recent <= 1.0:
            raise ConfigError(f"recent: expected a fraction from 0 to 1, found {recent!r}")
        free = total - layout.sinks
        nearest = page * math.floor(recent * free / page + 0.5)  # half rounds up, not to even
        window = min(max(page, nearest), page * (free // page))  # never past N
        return cls(window=window, pages=(free - window) // page, page=page, sinks=layout.sinks)
