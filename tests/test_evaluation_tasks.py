"""The long-context task generators and the scorer (edgeattn.evaluation): deterministic samples, every answer
in the prompt exactly once at the depth asked for, prompt lengths that match the target, exact-match scoring."""

from __future__ import annotations

import re

import pytest

from edgeattn.errors import ConfigError
from edgeattn.evaluation.haystack import FILLER
from edgeattn.evaluation.scoring import found, score
from edgeattn.evaluation.tasks import TASKS, make_sample, make_samples


def words(message: str) -> int:
    """A stand-in tokenizer: one token a word."""
    return len(message.split())


@pytest.mark.parametrize("task", sorted(TASKS))
def test_samples_are_deterministic_and_a_shorter_run_is_a_prefix(task):
    five = make_samples(task, 600, 5, words, seed=3)
    assert make_samples(task, 600, 5, words, seed=3) == five
    assert make_samples(task, 600, 2, words, seed=3) == five[:2]
    assert [s.answers for s in make_samples(task, 600, 5, words, seed=4)] != [s.answers for s in five]
    assert len({s.answers for s in five}) == 5


def _haystack(message: str) -> str:
    return message.split("\n\n")[1]


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.75, 1.0])
def test_the_answer_is_in_the_prompt_once_at_the_depth(task, depth):
    sample = make_sample(task, 800, 0, words, depth=depth)
    haystack = _haystack(sample.message)
    if task == "vartrack":
        value = re.search(r"assigned the value (\d+)", sample.message).group(1)
        first = f"VAR {sample.answers[0]} = {value}."
        for name in sample.answers:  # each variable of the chain is assigned once
            assert sample.message.count(f"VAR {name} =") == 1
        assert sample.message.count(value) == 2  # its assignment and the question
    else:
        answer, = sample.answers
        assert sample.message.count(answer) == 1
        first = next(s for s in re.split(r"(?<=\.) ", haystack) if answer in s)
    assert haystack.count(first) == 1
    before = haystack[:haystack.index(first)]  # the depth is the share of the filler before the needle
    filler = sum(haystack.count(f) for f in FILLER)
    assert abs(sum(before.count(f) for f in FILLER) / filler - depth) < 0.01
    assert sample.depth == depth


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("context", [300, 1000])
def test_the_prompt_fills_the_context_less_the_answer(task, context):
    sample = make_sample(task, context, 1, words)
    target = context - TASKS[task].max_tokens
    longest_filler = max(words(s) for s in FILLER)
    assert target - longest_filler <= sample.prompt_tokens == words(sample.message) <= target


def test_a_context_too_small_for_the_task_says_so():
    with pytest.raises(ConfigError, match="room for the task's instruction"):
        make_sample("multikey", 40, 0, words)


def test_unknown_task_and_bad_counts_are_errors():
    with pytest.raises(ConfigError, match="task: expected one of passkey, multikey, vartrack, found 'needle'"):
        make_samples("needle", 500, 1, words)
    with pytest.raises(ConfigError, match="samples: expected an integer >= 1"):
        make_samples("passkey", 500, 0, words)
    with pytest.raises(ConfigError, match="depth: expected a number from 0 to 1"):
        make_sample("passkey", 500, 0, words, depth=1.5)


def test_exact_match_finds_whole_answers_only():
    assert found("12345", "The pass key is 12345.")
    assert not found("12345", "The pass key is 123456.")
    assert not found("12345", "The pass key is 912345")
    assert not found("ABCDE", "ABCDEF")
    assert score(("ABCDE", "FGHIJ"), "They are: ABCDE, FGHIJ.")
    assert not score(("ABCDE", "FGHIJ"), "They are: ABCDE.")
    assert not score((), "anything")
