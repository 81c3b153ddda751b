"""Prefill in batches: the engine prefills the next chunk of every prefilling job in one backend call (within
the step's `prefill_tokens`), and a job's tokens and chunks stay what they are when it runs alone.

The scripted model here chooses the next token from the last id fed and the sum of every row its stream holds,
so a row written twice, skipped, or written into another stream's row changes the tokens."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edgeattn.errors import ConfigError
from edgeattn.runtime.generation.backend import PrefillBackend, SamplingPrefillBackend
from edgeattn.runtime.generation.engine import Engine, new_job
from edgeattn.runtime.generation.generator import GenerationConfig, Generator
from edgeattn.runtime.generation.sampling import SamplingConfig
from test_engine import VOCAB, ScriptedDecoder


class Summing(ScriptedDecoder):
    """The next token: 6 + (last id + the sum of the stream's rows) % 8; one chunk a step (no batched prefill)."""

    def step(self, cache, streams, ids, window, *, last_only=False):
        ids = np.asarray(ids)
        self.calls += 1
        if self.on_step is not None:
            self.on_step(self, list(streams), ids)
        logits = np.full((len(streams), 1, VOCAB), -10.0, np.float32)
        for row, s in enumerate(streams):
            logits[row, 0] = self._feed(cache, s, ids[row])
        return logits

    def _feed(self, cache, stream: int, chunk) -> np.ndarray:
        n = int(cache.positions[stream])
        cache.keys[0][stream, 0, self.layout.slots(np.arange(n, n + len(chunk))), 0] = chunk
        cache.positions[stream] += len(chunk)
        held = float(cache.keys[0][stream, 0, :min(n + len(chunk), self.layout.capacity), 0].sum())
        logits = np.full(VOCAB, -10.0, np.float32)
        logits[self.script.get(int(chunk[-1]), 6 + (int(chunk[-1]) + int(held)) % 8)] = 10.0
        return logits


class BatchedSumming(Summing):
    """The same model prefilling several streams a call; `fail_on`: a token whose chunk fails the call, after
    the streams before it in the call were written and advanced."""

    def __init__(self, *args, prefill_tokens: int = 1 << 20, fail_on: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prefill_tokens, self.fail_on = prefill_tokens, fail_on
        self.prefill_calls: list[list[int]] = []  # the chunk lengths of each call

    def prefill(self, cache, streams, chunks, window):
        self.prefill_calls.append([len(c) for c in chunks])
        out = np.zeros((len(streams), VOCAB), np.float32)
        for row, (s, chunk) in enumerate(zip(streams, chunks)):
            if self.fail_on in chunk.tolist():
                raise RuntimeError("bad chunk")
            out[row] = self._feed(cache, s, chunk)
        return out


class SampledBatchedSumming(BatchedSumming):
    """...choosing its tokens itself (greedy), as a GPU backend sampling on the device does."""

    def step_sample(self, cache, streams, ids, window, sampling):
        return self.step(cache, streams, ids, window)[:, -1].argmax(-1)

    def prefill_sample(self, cache, streams, chunks, window, sampling):
        assert len(sampling) == len(streams)
        self.sampled_prefills = getattr(self, "sampled_prefills", 0) + 1
        return self.prefill(cache, streams, chunks, window).argmax(-1)


def _run(model, prompts, limits, *, slots, chunk=4, window=0, prefill_tokens=None):
    """The jobs arriving together through one engine, stepped until done."""
    events = []
    engine = Engine(model, slots=slots, prefill_chunk=chunk, window=lambda: window, deliver=events.extend,
                    prefill_tokens=prefill_tokens)
    jobs = [new_job(model.layout, p, max_tokens=m, sampling=SamplingConfig()) for p, m in zip(prompts, limits)]
    for job in jobs:
        engine.add(job)
    for _ in range(500):
        if engine.idle():
            break
        engine.step()
    engine.flush()
    assert engine.idle()
    return jobs


def _alone(prompt, limit, *, chunk=4, window=0):
    config = GenerationConfig(max_tokens=limit, prefill_chunk=chunk, window=window)
    return Generator(Summing(window_max=24)).generate(prompt, config)


PROMPTS = [[1, 5, 9, 2, 7, 3, 8, 4, 11], [2, 3, 5, 7, 11, 13, 1, 4, 6, 8, 10, 12, 14, 9, 5, 3, 2], [4, 4, 1],
           [12, 1, 3, 5, 8, 13, 2, 1, 1, 2, 9, 7]]
LIMITS = [6, 9, 4, 7]


def test_the_backends_that_prefill_in_batches_satisfy_the_protocol():
    assert isinstance(BatchedSumming(), PrefillBackend) and not isinstance(BatchedSumming(), SamplingPrefillBackend)
    assert isinstance(SampledBatchedSumming(), SamplingPrefillBackend)
    assert not isinstance(Summing(), PrefillBackend)


def test_prompts_arriving_together_are_prefilled_in_one_call_a_step_and_get_their_tokens_alone():
    model = BatchedSumming(window_max=24)
    jobs = _run(model, PROMPTS, LIMITS, slots=4)
    assert model.prefill_calls == [[4, 4, 3, 4], [4, 4, 4], [1, 4, 4], [4], [1]]  # 9, 17, 3 and 12 tokens by 4
    for job, prompt, limit in zip(jobs, PROMPTS, LIMITS):
        alone = _alone(prompt, limit)
        assert (job.tokens, job.finish_reason) == (alone.tokens, alone.finish_reason), prompt


@pytest.mark.parametrize("budget", [0, 1, 8, 11])
def test_the_budget_decides_when_a_chunk_runs_never_its_length(budget):
    """A budget of 8 holds two chunks of 4 a call; 0 and 1 one chunk a step (the first chunk always runs)."""
    model = BatchedSumming(window_max=24)
    jobs = _run(model, PROMPTS, LIMITS, slots=4, prefill_tokens=budget)
    assert all(sum(call) <= max(budget, 4) for call in model.prefill_calls)
    assert sorted(n for call in model.prefill_calls for n in call) == sorted([4, 4, 1, 4, 4, 4, 4, 1, 3, 4, 4, 4])
    if budget <= 4:
        assert all(len(call) == 1 for call in model.prefill_calls)
    for job, prompt, limit in zip(jobs, PROMPTS, LIMITS):
        assert job.tokens == _alone(prompt, limit).tokens, (budget, prompt)


def test_a_window_cuts_the_first_chunks_by_the_sinks_rule_in_a_batch_as_alone():
    """Window 5, sinks 2: a first chunk ends by sinks + W = 7 (chunk 8 asked), whatever runs beside it."""
    model = BatchedSumming(window_max=24)
    prompts = [p * 2 for p in PROMPTS]
    jobs = _run(model, prompts, LIMITS, slots=4, chunk=8, window=5)
    assert model.prefill_calls[0] == [7, 7, 6, 7]
    for job, prompt, limit in zip(jobs, prompts, LIMITS):
        assert job.tokens == _alone(prompt, limit, chunk=8, window=5).tokens, prompt


def test_slots_moved_while_many_jobs_prefill_together_keep_each_jobs_rows():
    rng = random.Random(4)
    prompts = [[rng.randint(1, 14) for _ in range(rng.choice([2, 3, 9, 17]))] for _ in range(14)]
    limits = [rng.randint(1, 12) for _ in prompts]
    model = BatchedSumming(window_max=24)
    jobs = _run(model, prompts, limits, slots=3, chunk=3)
    assert max(len(call) for call in model.prefill_calls) == 3
    for job, prompt, limit in zip(jobs, prompts, limits):
        assert job.tokens == _alone(prompt, limit, chunk=3).tokens, prompt


def test_a_failing_stream_in_a_batched_prefill_ends_only_its_job():
    """The call fails after the streams before the bad one were advanced: the engine puts their positions back
    and runs each job alone; only the bad prompt's job ends, the others' tokens are their tokens alone."""
    model = BatchedSumming(window_max=24, fail_on=13)
    prompts = [PROMPTS[0], PROMPTS[3][:5], [2, 13, 4, 5, 6], PROMPTS[2] * 3]
    jobs = _run(model, prompts, LIMITS, slots=4)
    assert model.prefill_calls[:5] == [[4, 4, 4, 4], [4], [4], [4], [4]]  # the batch, then each alone
    bad = jobs[2]
    assert bad.finish_reason == "error: RuntimeError: bad chunk" and isinstance(bad.error, RuntimeError)
    for job, prompt, limit in zip(jobs, prompts, LIMITS):
        if job is not bad:
            alone = _alone(prompt, limit)
            assert (job.tokens, job.finish_reason) == (alone.tokens, alone.finish_reason), prompt


def test_a_backend_sampling_on_its_device_prefills_in_batches_too():
    model = SampledBatchedSumming(window_max=24)
    jobs = _run(model, PROMPTS, LIMITS, slots=4)
    assert model.sampled_prefills >= 3 and len(model.prefill_calls) == 5
    for job, prompt, limit in zip(jobs, PROMPTS, LIMITS):
        assert job.tokens == _alone(prompt, limit).tokens, prompt


def test_without_batched_prefill_a_step_runs_one_chunk_and_a_budget_is_checked():
    calls = []
    model = Summing(window_max=24, on_step=lambda m, streams, ids: calls.append(ids.shape))
    jobs = _run(model, PROMPTS[:2], LIMITS[:2], slots=2)
    assert all(shape[0] == 1 for shape in calls if shape[1] > 1)  # a prefill call holds one chunk
    assert [j.tokens for j in jobs] == [_alone(p, m).tokens for p, m in zip(PROMPTS[:2], LIMITS[:2])]
    with pytest.raises(ConfigError, match="prefill_tokens: expected >= 0"):
        Engine(model, slots=1, prefill_chunk=4, window=lambda: 0, deliver=print, prefill_tokens=-1)
