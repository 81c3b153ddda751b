"""The attention window as a live setting: the thermal controller and the admin API set it, inference reads it.

With it go retrieval pages: the live budget is the window W plus k pages of `page` rows
(edgeattn/attention/budget.py); k = 0, what a window alone sets, is the window as it always was.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from edgeattn.attention.budget import DEFAULT_PAGE, AttentionBudget
from edgeattn.errors import ConfigError

HISTORY_LENGTH = 100  # changes kept (oldest dropped first)
REASON_CHARS = 200  # a longer reason or source is cut to this


@dataclass(frozen=True)
class WindowChange:
    time: float  # time.time()
    old: int
    new: int
    source: str  # "controller", "admin", "startup", ...
    reason: str = ""
    old_pages: int = 0
    pages: int = 0  # retrieval pages beyond the window (0 = the window alone)


class LiveWindow:
    """Thread-safe holder of the current window (0 = full attention).

    `lock(w)` pins the window: later `set` calls from other sources are ignored (and reported) until
    `unlock()`. Listeners are called after each change, outside the lock. Values lie in 0..max_window
    (the longest sequence the served bundles accept; a larger window is full attention anyway), so a
    value the models' int64 input cannot hold is refused here. `history` keeps the last HISTORY_LENGTH
    changes, their reasons cut to REASON_CHARS.
    """

    def __init__(self, initial: int = 0, *, max_window: int | None = None, pages: int = 0,
                 page: int = DEFAULT_PAGE) -> None:
        self.max_window = max_window
        self._value = self._check(initial)
        self.page = AttentionBudget(0, 0, page).page  # checked as a budget's
        self._pages = self._check_pages(pages)
        self._locked = False
        self._guard = threading.Lock()
        self._listeners: list[Callable[[WindowChange], None]] = []
        self.history: deque[WindowChange] = deque(maxlen=HISTORY_LENGTH)

    def bound(self, max_window: int) -> None:
        """Set the largest window (done once the served bundles are known); the current value must fit."""
        if max_window < 0:
            raise ConfigError(f"max_window: expected >= 0, found {max_window}")
        self.max_window = max_window
        self._check(self._value)

    def _check(self, value: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"window: expected an integer, found {type(value).__name__} {str(value)[:40]!r}")
        if self.max_window is not None and not 0 <= value <= self.max_window:
            raise ConfigError(f"window: expected 0..{self.max_window} (0 = full attention, {self.max_window} = "
                              f"the longest sequence served), found {str(value)[:40]}")
        if value < 0:
            raise ConfigError(f"window: expected >= 0 (0 = full), found {value}")
        return value

    @staticmethod
    def _check_pages(pages: int) -> int:
        if isinstance(pages, bool) or not isinstance(pages, int) or pages < 0:
            raise ConfigError(f"pages: expected an integer >= 0 (0 = the window alone), found "
                              f"{type(pages).__name__} {str(pages)[:40]!r}")
        return pages

    def get(self) -> int:
        return self._value

    @property
    def pages(self) -> int:
        return self._pages

    def budget(self) -> AttentionBudget:
        """The live budget: the window and the pages, read together (what the decode engine reads a step)."""
        with self._guard:
            return AttentionBudget(self._value, self._pages, self.page)

    @property
    def locked(self) -> bool:
        return self._locked

    def set(self, value: int, source: str = "admin", reason: str = "", *, pages: int = 0) -> bool:
        """Set the window and the pages (0: the window alone); returns False when a lock held them unchanged."""
        value, pages = self._check(value), self._check_pages(pages)
        with self._guard:
            if self._locked:
                return False
            change = self._apply(value, source, reason, pages)
        self._notify(change)
        return True

    def lock(self, value: int | None = None, source: str = "admin", *, pages: int = 0) -> None:
        """Pin the window (and pages) at `value`, or as they are when `value` is None."""
        change = None
        with self._guard:
            if value is not None:
                change = self._apply(self._check(value), source, "locked", self._check_pages(pages))
            self._locked = True
        self._notify(change)

    def unlock(self) -> None:
        with self._guard:
            self._locked = False

    def subscribe(self, listener: Callable[[WindowChange], None]) -> None:
        self._listeners.append(listener)

    def _apply(self, value: int, source: str, reason: str, pages: int = 0) -> WindowChange | None:
        if (value, pages) == (self._value, self._pages):
            return None
        change = WindowChange(time.time(), self._value, value, source[:REASON_CHARS], reason[:REASON_CHARS],
                              self._pages, pages)
        self._value, self._pages = value, pages
        self.history.append(change)
        return change

    def _notify(self, change: WindowChange | None) -> None:
        if change is not None:
            for listener in list(self._listeners):
                listener(change)
