"""Input-channel permutation for 2:4 pruning: reorder K so that each group of 4 keeps more magnitude.

Permuting the consumer's input channels is exact only when the producer of its activation is permuted
the same way. That holds, and is applied in the model, for feed-forward pairs whose activation is
elementwise: BERT `intermediate.dense -> output.dense`, Llama `gate_proj/up_proj -> down_proj`. Other
Linears (q/k/v/o, read from the residual stream or the head layout) get the search as a score only: the
report shows the kept magnitude with and without, and the model is not changed for them.
"""

from __future__ import annotations

from edgeattn.optional import require
from edgeattn.quantize.sparsity.two_four import has_mask, kept_magnitude

# consumer suffix -> producer suffixes, for feed-forward blocks with an elementwise activation between.
FFN_PAIRS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("output.dense", ("intermediate.dense",)),  # BERT (not attention.output.dense: see _pairs)
    ("mlp.down_proj", ("mlp.gate_proj", "mlp.up_proj")),  # Llama / SmolLM2
)


def _kept(groups):
    """groups: [..., N, 4] -> kept |w| under 2:4: [...]."""
    return groups.topk(2, dim=-1).values.sum((-1, -2))


def search_permutation(weight, iters: int = 400, seed: int = 0):
    """A permutation `perm` of K such that |weight[:, perm]| keeps more magnitude under 2:4.

    Greedy group-pair search: each trial takes two groups of 4 and tries the 16 single-channel swaps
    between them at once, keeping the best if it raises the kept magnitude. weight: [N, K].
    """
    torch = require("torch", "channel permutation")
    n, k = weight.shape
    w = weight.detach().abs().float().clone()  # w: [N, K], columns in the current order
    perm = torch.arange(k)
    ngroups = k // 4
    if ngroups < 2:
        return perm
    gen = torch.Generator().manual_seed(seed)
    ii = torch.arange(4).repeat_interleave(4)  # swap t moves channel ii[t] of group a ...
    jj = torch.arange(4).repeat(4)  # ... with channel jj[t] of group b
    t16 = torch.arange(16)
    for _ in range(iters):
        a, b = torch.randperm(ngroups, generator=gen)[:2].tolist()
        ca, cb = w[:, 4 * a:4 * a + 4], w[:, 4 * b:4 * b + 4]  # [N, 4] each
        ga = ca.expand(16, n, 4).clone()  # [16, N, 4]
        gb = cb.expand(16, n, 4).clone()
        ga[t16, :, ii] = cb[:, jj].T
        gb[t16, :, jj] = ca[:, ii].T
        gain = _kept(ga) + _kept(gb) - (_kept(ca) + _kept(cb))
        best = int(gain.argmax())
        if gain[best] <= 1e-7 * float(ca.sum() + cb.sum()):
            continue
        x, y = 4 * a + int(ii[best]), 4 * b + int(jj[best])
        perm[[x, y]] = perm[[y, x]]
        w[:, [x, y]] = w[:, [y, x]]
    return perm


def _pairs(model):
    """(consumer name, consumer, [producers]) for the feed-forward pairs of FFN_PAIRS."""
    modules = dict(model.named_modules())
    for name, module in modules.items():
        for consumer_suffix, producer_suffixes in FFN_PAIRS:
            if not name.endswith(consumer_suffix) or name.endswith("attention.output.dense"):
                continue
            prefix = name[: -len(consumer_suffix)]
            producers = [modules.get(prefix + s) for s in producer_suffixes]
            if all(p is not None for p in producers):
                yield name, module, producers


def apply_pair_permutations(model, config) -> dict[str, tuple[float, float]]:
    """Permute the consumer's input channels and its producers' output channels (function-preserving).

    Returns consumer name -> (kept magnitude before, after).
    """
    torch = require("torch", "channel permutation")
    done = {}
    with torch.no_grad():
        for name, consumer, producers in _pairs(model):
            if consumer.in_features % 4 or has_mask(consumer) or any(has_mask(p) for p in producers):
                continue
            before = kept_magnitude(consumer.weight)
            perm = search_permutation(consumer.weight, config.permute_iters)
            consumer.weight.copy_(consumer.weight[:, perm])
            for p in producers:
                p.weight.copy_(p.weight[perm, :])
                if p.bias is not None:
                    p.bias.copy_(p.bias[perm])
            done[name] = (before, kept_magnitude(consumer.weight))
    return done
