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
    sample = make_sample(task, 800, 0, words, depth=depth, form="chat")
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


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("depth", [0.0, 0.4, 1.0])
def test_raw_form_ends_with_the_answer_prefix_and_holds_each_needle_once(task, depth):
    sample = make_sample(task, 700, 2, words, depth=depth, form="raw")
    chat = make_sample(task, 700, 2, words, depth=depth, form="chat")
    assert sample.form == "raw" and chat.form == "chat"
    assert sample.answers == chat.answers  # the form changes the wording, not the draws
    assert "\n" not in sample.message  # a plain completion, no message layout
    prefix = {"passkey": "What is the pass key? The pass key is",
              "multikey": "mentioned in the provided text? The special magic number for",
              "vartrack": "variables are assigned the value"}[task]
    assert prefix in sample.message[-len(sample.message) // 4:]
    assert sample.message.endswith(("The pass key is", "mentioned in the provided text is", "they are:"))
    if task == "passkey":
        key, = sample.answers
        assert sample.message.count(f"The pass key is {key}. Remember it. {key} is the pass key.") == 1
        assert sample.message.count(key) == 2  # twice in its one needle, as in the original test
    elif task == "multikey":
        assert sample.message.count(sample.answers[0]) == 1
    else:
        for name in sample.answers:
            assert sample.message.count(f"VAR {name} =") == 1


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("context", [300, 1000])
def test_raw_form_fills_the_context_and_is_deterministic(task, context):
    sample = make_sample(task, context, 1, words, form="raw")
    target = context - TASKS[task].max_tokens
    assert target - max(words(s) for s in FILLER) <= sample.prompt_tokens == words(sample.message) <= target
    assert make_samples(task, context, 2, words, form="raw")[1] == sample


def test_the_default_form_is_the_tasks_and_a_bad_form_is_an_error():
    assert make_sample("passkey", 400, 0, words).form == TASKS["passkey"].form == "raw"
    assert make_sample("multikey", 400, 0, words).form == TASKS["multikey"].form
    with pytest.raises(ConfigError, match="prompt form: expected one of chat, raw, found 'plain'"):
        make_sample("passkey", 400, 0, words, form="plain")
