"""Stop strings over streamed text: the text a client sees never holds a stop string, nor any part of one.

`StopMatcher.feed(piece)` returns (text to emit, whether a stop string ended the text). It holds back the
longest tail of the text that could still begin a stop string and releases it as soon as it cannot; when a
stop string appears, the text ends where the earliest one begins. Each stop string is followed by a
Knuth-Morris-Pratt automaton whose table is built only as far as the text has matched, so a piece costs time
in proportion to its own length (amortized), whatever the length of the stop strings: a 500 KB stop string
costs no more per token than a short one.
"""

from __future__ import annotations

from collections import deque


class _Automaton:
    """Matches one stop string over a stream of characters; `state` = the longest prefix of the stop string
    that the text read so far ends with."""

    def __init__(self, stop: str) -> None:
        self.stop, self.state = stop, 0
        self.fail: list[int] = [0]  # fail[j]: the longest proper border of stop[:j + 1], built on demand

    def _border(self, j: int) -> int:
        """fail[j], extending the table one entry at a time (j <= len(fail): amortized O(1) an entry)."""
        fail, stop = self.fail, self.stop
        while len(fail) <= j:
            i, k = len(fail), fail[-1]
            while k and stop[i] != stop[k]:
                k = fail[k - 1]
            fail.append(k + 1 if stop[i] == stop[k] else k)
        return fail[j]

    def advance(self, char: str) -> bool:
        """Read one character; True when the stop string ends with it (the automaton then starts over)."""
        q, stop = self.state, self.stop
        while q and stop[q] != char:
            q = self._border(q - 1)
        if stop[q] == char:
            q += 1
        if q == len(stop):
            self.state = 0
            return True
        self.state = q
        return False


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self._automata = [_Automaton(s) for s in stops]
        self._held: deque[str] = deque()  # text not yet emitted, in pieces
        self._held_chars = 0
        self._offset = 0  # characters of the first held piece already emitted

    def feed(self, piece: str) -> tuple[str, bool]:
        if not self.stops:
            return piece, False
        before = self._held_chars
        cut = None  # where the earliest stop string begins, counted from the start of the held text
        for automaton in self._automata:
            for i, char in enumerate(piece):
                if automaton.advance(char):
                    start = before + i + 1 - len(automaton.stop)
                    cut = start if cut is None else min(cut, start)
                    break
        self._held.append(piece)
        self._held_chars += len(piece)
        if cut is not None:
            text = "".join(self._held)[self._offset:self._offset + cut]
            self._reset()
            return text, True
        keep = max(a.state for a in self._automata)
        return self._release(self._held_chars - keep), False

    def flush(self) -> str:
        """The held text, at the end of the stream (it began a stop string that never came)."""
        text = "".join(self._held)[self._offset:]
        self._reset()
        return text

    def _release(self, n: int) -> str:
        """The first n held characters (each held character is copied out once: the head piece is read from an
        offset, not cut)."""
        out = []
        while n > 0:
            head, start = self._held[0], self._offset
            take = min(n, len(head) - start)
            out.append(head[start:start + take])
            n -= take
            self._held_chars -= take
            if start + take == len(head):
                self._held.popleft()
                self._offset = 0
            else:
                self._offset = start + take
        return "".join(out)

    def _reset(self) -> None:
        self._held.clear()
        self._held_chars = self._offset = 0
        for automaton in self._automata:
            automaton.state = 0
