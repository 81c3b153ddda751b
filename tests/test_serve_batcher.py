"""The dynamic batcher with a recording fake model: stacking, one answer per request, errors kept apart."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from edgeattn.runtime.server.batcher import DynamicBatcher, QueueFull


class RecordingModel:
    """out = x * 2 (float64 reference); a row whose first value is negative makes the whole run fail."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def __call__(self, feeds):
        x = feeds["x"]
        if (x[:, 0] < 0).any():
            raise ValueError("negative first value")
        self.batches.append(x.shape[0])
        return {"y": x.astype(np.float64) * 2, "n": np.arange(x.shape[0])}, 7


def _run(coro):
    return asyncio.run(coro)


async def _with_batcher(model, body, **kw):
    batcher = DynamicBatcher("m", model, **{"max_batch": 8, "max_delay_s": 0.05, "max_queue": 64, **kw})
    batcher.start()
    try:
        return await body(batcher)
    finally:
        await batcher.stop()


def test_equal_shapes_are_stacked_and_answers_go_back_to_their_requests():
    model = RecordingModel()
    requests = [np.full((1, 3), i, np.float32) for i in range(6)] + [np.full((2, 3), 9, np.float32)]

    async def body(batcher):
        return await asyncio.gather(*(batcher.submit({"x": r}, r.shape[0]) for r in requests))

    outcomes = _run(_with_batcher(model, body))
    assert model.batches == [8]  # 6 single rows and one double row in one run
    for request, outcome in zip(requests, outcomes):
        np.testing.assert_array_equal(outcome.outputs["y"], request.astype(np.float64) * 2)
        assert outcome.window == 7 and outcome.batch_rows == 8
    assert [o.outputs["n"].tolist() for o in outcomes[-2:]] == [[5], [6, 7]]


def test_different_shapes_never_share_a_batch_and_max_batch_caps_rows():
    model = RecordingModel()
    requests = [np.ones((1, 3 + i % 2), np.float32) * i for i in range(10)]

    async def body(batcher):
        return await asyncio.gather(*(batcher.submit({"x": r}, 1) for r in requests))

    outcomes = _run(_with_batcher(model, body, max_batch=4))
    assert sorted(model.batches) == [1, 1, 4, 4]
    for request, outcome in zip(requests, outcomes):
        np.testing.assert_array_equal(outcome.outputs["y"], request * 2)


def test_an_error_reaches_only_the_request_that_caused_it():
    model = RecordingModel()
    requests = [np.full((1, 2), v, np.float32) for v in (1, -1, 2, 3)]

    async def body(batcher):
        return await asyncio.gather(*(batcher.submit({"x": r}, 1) for r in requests), return_exceptions=True)

    outcomes = _run(_with_batcher(model, body))
    assert isinstance(outcomes[1], ValueError)
    for i in (0, 2, 3):
        np.testing.assert_array_equal(outcomes[i].outputs["y"], requests[i] * 2)


def test_a_full_queue_pushes_back_and_stop_finishes_the_queued_requests():
    model = RecordingModel()

    async def body(batcher):
        tasks = [asyncio.ensure_future(batcher.submit({"x": np.ones((1, 1), np.float32)}, 1)) for _ in range(5)]
        await asyncio.sleep(0)  # all five are queued; the worker waits for the batch to fill
        with pytest.raises(QueueFull) as refused:
            await batcher.submit({"x": np.ones((1, 1), np.float32)}, 1)
        assert refused.value.status == 503
        await batcher.stop()  # drains: the queued five are answered
        return [t.result() for t in tasks]

    outcomes = _run(_with_batcher(model, body, max_queue=5, max_delay_s=10.0))
    assert len(outcomes) == 5 and sum(model.batches) == 5


def test_max_batch_one_runs_each_request_alone():
    model = RecordingModel()

    async def body(batcher):
        return await asyncio.gather(*(batcher.submit({"x": np.ones((1, 2), np.float32)}, 1) for _ in range(5)))

    _run(_with_batcher(model, body, max_batch=1))
    assert model.batches == [1] * 5
