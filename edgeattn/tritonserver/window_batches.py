"""The requests of one Triton `execute` call, run as batches of the bundle: the Python-backend encoder model's core.

Triton's dynamic batcher hands the Python backend a list of requests and leaves the batching to the model. It
batches requests whatever the values of their inputs (it never batches one that gives the optional
`attention_window` input with one that leaves it out), while a bundle runs one window per call (the attention
op's window is a scalar: its blocks follow it). So requests are grouped by window and by their shapes after the
batch axis; each group is concatenated along the batch axis, run once, and its outputs split back by rows. When a
group fails, its requests run one by one, so that an error belongs to its own request and never fails the batch.

Plain numpy, no Triton: `python_model.py` reads the requests and sends the responses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgeattn.errors import InputError, RuntimeBackendError

WINDOW_PARAMETER = "edgeattn_window"  # config.pbtxt parameter: the window of requests that give none


@dataclass(frozen=True)
class Pending:
    """One request: its feeds (each leading with the batch axis when batched) and the window it asked for."""

    feeds: dict[str, np.ndarray]
    window: int


def request_window(values: np.ndarray | None, default: int) -> int:
    """The window a request asks for: one value per row (`[rows, 1]`), all equal and >= 0; `default` if absent."""
    if values is None:
        return default
    flat = np.asarray(values).reshape(-1)
    if flat.size == 0 or flat.dtype.kind not in "iu":
        raise InputError(f"attention_window: expected integers, one per row, found {flat.size} value(s) of "
                         f"{flat.dtype}")
    if (flat != flat[0]).any():
        raise InputError(f"attention_window: expected one window for the whole request, found "
                         f"{sorted(set(flat.tolist()))} (send rows with other windows as other requests)")
    if flat[0] < 0:
        raise InputError(f"attention_window: expected >= 0 (0 = full attention), found {int(flat[0])}")
    return int(flat[0])


def _key(item: Pending) -> tuple:
    return item.window, tuple((name, value.shape[1:], value.dtype.str) for name, value in sorted(item.feeds.items()))


def run(pending: list[Pending | Exception], infer: Callable[[dict[str, np.ndarray], int], dict[str, np.ndarray]],
        batched: bool) -> list[dict[str, np.ndarray] | Exception]:
    """Outputs (or the error) for each request, in order; an Exception in `pending` is passed through.

    `infer(feeds, window)` runs the bundle once. `batched`: the inputs lead with the batch axis (max_batch_size
    > 0), so requests of one window and one shape are concatenated; otherwise each runs alone."""
    results: list = list(pending)
    groups: dict[tuple, list[int]] = {}
    for i, item in enumerate(pending):
        if not isinstance(item, Exception):
            groups.setdefault(_key(item) if batched else (i,), []).append(i)
    for members in groups.values():
        if len(members) > 1:
            try:
                for i, outputs in zip(members, _together([pending[i] for i in members], infer)):
                    results[i] = outputs
                continue
            except Exception:  # noqa: BLE001  (run them one by one: each error goes to its own request)
                pass
        for i in members:
            try:
                results[i] = infer(pending[i].feeds, pending[i].window)
            except Exception as exc:  # noqa: BLE001  (the request's own error, sent back to it)
                results[i] = exc
    return results


def _together(items: list[Pending], infer) -> list[dict[str, np.ndarray]]:
    """One run of the concatenated requests; the outputs split back by each request's rows."""
    rows = [next(iter(item.feeds.values())).shape[0] for item in items]
    feeds = {name: np.concatenate([item.feeds[name] for item in items]) for name in items[0].feeds}
    outputs = infer(feeds, items[0].window)
    bounds = np.cumsum(rows)[:-1]
    for name, value in outputs.items():
        if value.shape[:1] != (sum(rows),):
            raise RuntimeBackendError(f"output {name!r}: expected {sum(rows)} rows (the batch), found shape "
                                      f"{value.shape}")
    split = {name: np.split(value, bounds) for name, value in outputs.items()}
    return [{name: parts[j] for name, parts in split.items()} for j in range(len(items))]
