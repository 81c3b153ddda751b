"""Sampling on the device (runtime/cuda/sampling.py), run on CPU tensors: greedy rows, top-k and top-p sets
against a float64 NumPy reference, the draw frequencies against softmax, and per-stream reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgeattn.runtime.cuda.sampling import DeviceSampling, sample, uniforms  # noqa: E402
from edgeattn.runtime.generation.sampling import SamplingConfig  # noqa: E402


def params(configs):
    p = DeviceSampling.for_streams(len(configs), "cpu")
    for row, c in enumerate(configs):
        p.set(row, c)
    return p


def test_uniforms_are_uniform_and_depend_on_seed_and_position():
    u = uniforms(torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0]), 50_000)
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.std()) - (1 / 12) ** 0.5) < 0.01
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert torch.equal(u[0], uniforms(torch.tensor([1]), torch.tensor([0]), 50_000)[0])


def test_greedy_rows_take_the_argmax_beside_sampled_rows():
    logits = torch.randn(3, 100)
    ids = sample(logits, params([SamplingConfig(), SamplingConfig(temperature=1.0, seed=3), SamplingConfig()]),
                 torch.tensor([5, 5, 9]))
    assert ids[0] == logits[0].argmax() and ids[2] == logits[2].argmax()


def kept_set(logits, top_k, top_p, temperature=1.0):
    """float64 reference of the tokens top-k then top-p keep (as runtime/generation/sampling.py)."""
    x = logits.astype(np.float64) / temperature
    if top_k:
        x = np.where(x < np.sort(x)[-top_k], -np.inf, x)
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.cumsum(p[order]) - p[order] < top_p
    return set(order[keep].tolist())


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.5), (20, 0.8), (0, 1.0)])
def test_draws_stay_inside_the_kept_set_and_follow_softmax(top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(1, 40) * 2
    n = 4000
    config = SamplingConfig(temperature=0.7, top_k=top_k, top_p=top_p, seed=11)
    p = params([config] * n)
    p.seeds.copy_(torch.arange(n))  # n independent streams, one draw each
    ids = sample(logits.expand(n, 40), p, torch.zeros(n, dtype=torch.int64)).numpy()
    kept = kept_set(logits[0].numpy(), top_k, top_p, 0.7)
    assert set(ids.tolist()) <= kept
    x = logits[0].double().numpy() / 0.7
    probs = np.zeros(40)
    idx = sorted(kept)
    probs[idx] = np.exp(x[idx] - x[idx].max())
    probs /= probs.sum()
    freq = np.bincount(ids, minlength=40) / n
    assert np.abs(freq - probs).max() < 0.03, (freq, probs)


def test_a_stream_draws_the_same_tokens_whatever_runs_beside_it():
    torch.manual_seed(1)
    logits = torch.randn(4, 64)
    logits[3] = logits[1]  # the same stream twice, beside two others
    c = SamplingConfig(temperature=1.0, top_p=0.9, seed=7)
    alone = params([c])
    together = params([SamplingConfig(temperature=1.0, seed=1), c, SamplingConfig(), c])
    draws = []
    for position in range(20, 25):  # the same stream at the same positions, alone and in a batch of 4
        a = sample(logits[1:2], alone, torch.tensor([position]))
        t = sample(logits, together, torch.tensor([3, position, 7, position]))
        assert int(a[0]) == int(t[1]) == int(t[3])
        draws.append(int(a[0]))
    assert len(set(draws)) > 1  # a new position, a new draw
