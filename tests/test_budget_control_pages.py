"""Per-request budgets with retrieval pages on ONNX Runtime: a tiny Llama exported with pages of 16 rows (4 sinks,
a ring of 48), served by the slot scheduler under a live budget of a window and two pages, with requests that cap
it at other budgets in the same steps. Each stream's tokens equal the Generator's alone at its own budget."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from decoder_fixtures import SINKS, requires_decoder_stack
from edgeattn.attention.budget import AttentionBudget

PAGE = 16
SAMPLING = dict(temperature=0.7, seed=5)  # greedy repeats one token on this model: sampling shows the budget

pytestmark = [requires_decoder_stack, pytest.mark.slow]


def test_budgets_with_pages_in_one_batch_each_give_the_tokens_of_their_own_budget(tiny_paged_decoder):
    from edgeattn.runtime.generation.engine import new_job
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator
    from edgeattn.runtime.generation.sampling import SamplingConfig
    from edgeattn.runtime.server.scheduler import SlotScheduler

    live = AttentionBudget(16, 2, PAGE)  # 4 + 16 + 32 = 52 rows: the whole cache, read as a window and pages
    caps = {None: (16, 2), 36: (16, 1), 20: (16, 0)}  # the request's cap -> (window, pages) it runs with
    prompt = [int(t) for t in np.random.default_rng(3).integers(100, 20000, 40)]
    prompts = [prompt] * len(caps)  # one prompt: the budget alone tells the streams apart
    sampling = SamplingConfig(**SAMPLING)
    with Generator.open(tiny_paged_decoder) as gen:
        refs = [gen.generate(p, GenerationConfig(max_tokens=30, prefill_chunk=16, sampling=sampling),
                             window=AttentionBudget(*caps[cap], PAGE)) for p, cap in zip(prompts, caps)]
        done, events = threading.Event(), {}

        def deliver(batch):
            for job, event in batch:
                events.setdefault(id(job), []).append(event)
            if all(j.finish_reason is not None for j in jobs):
                done.set()

        scheduler = SlotScheduler(gen.model, slots=4, max_queue=4, prefill_chunk=16, window=lambda: live,
                                  deliver=deliver)
        jobs = [new_job(gen.model.layout, p, max_tokens=30, sampling=sampling, budget=cap)
                for p, cap in zip(prompts, caps)]
        scheduler.start()
        try:
            for job in jobs:
                scheduler.submit(job)
            assert done.wait(300)
        finally:
            scheduler.close()
    for job, ref, (window, pages) in zip(jobs, refs, caps.values()):
        assert job.error is None and job.tokens == ref.tokens
        assert {(e.window, e.budget) for e in events[id(job)] if e.tokens} == {(window, SINKS + window + pages * PAGE)}
    assert len({tuple(r.tokens) for r in refs}) == 3  # each budget gives other tokens: the pages count
