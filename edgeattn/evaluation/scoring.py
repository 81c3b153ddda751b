"""Exact match: a sample is right when every one of its answers appears in the generated text as a whole token
(not inside a longer number or word: 12345 is not found in 123456)."""

from __future__ import annotations

import re


def found(answer: str, text: str) -> bool:
    return re.search(rf"(?<![0-9A-Za-z]){re.escape(answer)}(?![0-9A-Za-z])", text) is not None


def score(answers: tuple[str, ...], text: str) -> bool:
    return bool(answers) and all(found(a, text) for a in answers)
