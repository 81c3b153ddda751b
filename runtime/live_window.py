"""The attention window as a live setting: the thermal controller and the admin API set it, inference reads it."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

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


class LiveWindow:
    """Thread-safe holder of the current window (0 = full attention).

    `lock(w)` pins the window: later `set` calls from other sources are ignored (and reported) until
    `unlock()`. Listeners are called after each change, outside the lock. Values lie in 0..max_window
    (the longest sequence the served bundles accept; a larger window is full attention anyway), so a
    value the models' int64 input cannot hold is refused here. `history` keeps the last HISTORY_LENGTH
    changes, their reasons cut to REASON_CHARS.
    """

    def __init__(self, initial: int = 0, *, max_window: int | None = None) -> None:
        self.max_window = max_window
        self._value = self._check(initial)
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

    def get(self) -> int:
        return self._value

    @property
    def locked(self) -> bool:
        return self._locked

    def set(self, value: int, source: str = "admin", reason: str = "") -> bool:
        """Set the window; returns False when a lock held it unchanged."""
        value = self._check(value)
        with self._guard:
            if self._locked:
                return False
            change = self._apply(value, source, reason)
        self._notify(change)
        return True

    def lock(self, value: int | None = None, source: str = "admin") -> None:
        change = None
        with self._guard:
            if value is not None:
                change = self._apply(self._check(value), source, "locked")
            self._locked = True
        self._notify(change)

    def unlock(self) -> None:
        with self._guard:
            self._locked = False

    def subscribe(self, listener: Callable[[WindowChange], None]) -> None:
        self._listeners.append(listener)

    def _apply(self, value: int, source: str, reason: str) -> WindowChange | None:
        if value == self._value:
            return None
        change = WindowChange(time.time(), self._value, value, source[:REASON_CHARS], reason[:REASON_CHARS])
        self._value = value
        self.history.append(change)
        return change

    def _notify(self, change: WindowChange | None) -> None:
        if change is not None:
            for listener in list(self._listeners):
                listener(change)
