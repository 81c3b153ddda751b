"""The Python-backend encoder model's batches: requests grouped by window and shape, run once, split back by rows;
an error stays with its own request."""

from __future__ import annotations

import numpy as np
import pytest

from edgeattn.errors import InputError
from edgeattn.tritonserver.window_batches import Pending, request_window, run


def _infer(calls):
    def infer(feeds, window):
        calls.append((window, feeds["x"].shape[0]))
        if (feeds["x"] < 0).any():
            raise ValueError("negative input")
        return {"y": feeds["x"] * 10 + window}
    return infer


def _request(rows, window, start=0, cols=3):
    return Pending({"x": np.arange(start, start + rows * cols, dtype=np.int64).reshape(rows, cols)}, window)


def test_requests_of_one_window_and_shape_run_as_one_batch_and_split_back():
    calls = []
    pending = [_request(2, 0), _request(1, 4, 100), _request(3, 0, 200), _request(1, 4, 300),
               _request(1, 0, 400, cols=5)]
    results = run(pending, _infer(calls), batched=True)
    assert sorted(calls) == sorted([(0, 5), (4, 2), (0, 1)])  # two windows; the 5-wide request alone
    for item, result in zip(pending, results):
        np.testing.assert_array_equal(result["y"], item.feeds["x"] * 10 + item.window)


def test_an_error_belongs_to_its_own_request():
    calls = []
    bad = Pending({"x": -np.ones((1, 3), np.int64)}, 0)
    refused = InputError("attention_window: expected >= 0")
    results = run([_request(2, 0), bad, refused, _request(1, 0, 50)], _infer(calls), batched=True)
    assert isinstance(results[1], ValueError) and results[2] is refused
    np.testing.assert_array_equal(results[0]["y"], _request(2, 0).feeds["x"] * 10)
    np.testing.assert_array_equal(results[3]["y"], _request(1, 0, 50).feeds["x"] * 10)
    assert calls[0] == (0, 4) and sorted(calls[1:]) == [(0, 1), (0, 1), (0, 2)]  # the batch, then one by one


def test_without_batching_each_request_runs_alone():
    calls = []
    run([_request(1, 0), _request(1, 0, 10)], _infer(calls), batched=False)
    assert calls == [(0, 1), (0, 1)]


def test_request_window_reads_one_value_per_row():
    assert request_window(None, 7) == 7
    assert request_window(np.array([[5], [5]], np.int64), 0) == 5
    with pytest.raises(InputError, match="one window for the whole request"):
        request_window(np.array([[5], [6]], np.int64), 0)
    with pytest.raises(InputError, match=">= 0"):
        request_window(np.array([[-1]], np.int64), 0)
    with pytest.raises(InputError, match="integers"):
        request_window(np.array([[1.5]], np.float32), 0)
