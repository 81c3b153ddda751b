"""Runs the attention budget's Triton kernels under TRITON_INTERPRET=1 on CPU tensors; prints one JSON line.

Started as its own process by tests/test_budget_gpu.py (the variable must be set before triton loads). Checked
against the float64 oracle (edgeattn.attention.cached_reference). fp16: the interpreter computes bf16 dots wrongly.
"""

from __future__ import annotations

import json
import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from edgeattn.attention.cached_reference import cached_attention_np, page_bounds_np  # noqa: E402
from edgeattn.attention.ring import RingLayout  # noqa: E402
from edgeattn.plugins.kernels.budget_bounds import refresh_bounds, ring_write_bounds, with_sums  # noqa: E402
from edgeattn.plugins.kernels.budget_decode import budget_decode, select_pages  # noqa: E402

DT = torch.float16


def filled_pages_error(bounds, k_cache, positions, sinks, page) -> float:
    """Max |bounds - recomputed| over the pages holding a filled row (empty pages: not read by the kernels)."""
    want = page_bounds_np(k_cache.numpy(), positions.numpy(), sinks, page).astype(np.float64)
    got = bounds.double().numpy()
    live = np.isfinite(want[:, :, :, 0, :1])[..., None, :]  # [B, H_kv, P, 1, 1]: the page holds a filled row
    return float(np.abs(np.where(live, got - want, 0.0)).max())


def sums_differ(sums, pairs) -> float:
    """Entries where bounds of 3 vectors a page differ from with_sums(the same bounds of 2) (empty pages: equal)."""
    want = with_sums(pairs)
    return float((~((sums == want) | (sums.isnan() & want.isnan()))).sum())


def bounds_cases(out: dict) -> None:
    """Decode writes through two ring wraps, then prefill chunks that overwrite pages partly; bounds of 3 vectors a
    page (the sum kept) written the same way alongside."""
    torch.manual_seed(0)
    b, h_kv, d, sinks, wmax, page = 2, 2, 16, 2, 32, 8
    c = sinks + wmax
    kc, vc = torch.randn(b, h_kv, c, d).to(DT), torch.randn(b, h_kv, c, d).to(DT)  # junk in the empty rows
    bounds = torch.zeros(b, h_kv, wmax // page, 2, d, dtype=DT)
    kc3, vc3, sums = kc.clone(), vc.clone(), torch.zeros(b, h_kv, wmax // page, 3, d, dtype=DT)
    pos = torch.tensor([0, 7])
    worst = differ = 0.0
    for step in range(80):  # stream 1 starts 7 tokens ahead: two wraps, pages rewritten row by row
        k, v = torch.randn(b, h_kv, d).to(DT), torch.randn(b, h_kv, d).to(DT)
        ring_write_bounds(k, v, kc, vc, bounds, pos, sinks=sinks, page=page)
        ring_write_bounds(k, v, kc3, vc3, sums, pos, sinks=sinks, page=page)
        differ += sums_differ(sums, bounds)
        slots = RingLayout(sinks, wmax).slots(pos.numpy())
        assert all(torch.equal(kc[i, :, slots[i]], k[i]) and torch.equal(vc[i, :, slots[i]], v[i]) for i in range(b))
        pos = pos + 1
        if step % 7 == 3 or step == 79:
            worst = max(worst, filled_pages_error(bounds, kc, pos, sinks, page))
    out["bounds:decode-writes"] = worst
    out["sums:decode-writes"] = differ
    worst = 0.0
    for start, count in ((pos.tolist(), 13), ([90, 3], 5), ([95, 8], 40)):  # partial pages, a chunk past the ring
        start = torch.tensor(start)
        layout = RingLayout(sinks, wmax)
        for i in range(b):
            rows = layout.slots(np.arange(int(start[i]), int(start[i]) + min(count, wmax)) + max(count - wmax, 0))
            kc[i][:, rows] = torch.randn(h_kv, len(rows), d).to(DT)
        refresh_bounds(kc, bounds, start, count, sinks=sinks, page=page)
        worst = max(worst, filled_pages_error(bounds, kc, start + count, sinks, page))
    out["bounds:refresh-chunks"] = worst
    fresh = torch.zeros_like(bounds)  # everything from the rows at once (a cache that had no bounds)
    ends = torch.tensor([60, 5])
    refresh_bounds(kc, fresh, ends - c, c, sinks=sinks, page=page)
    out["bounds:refresh-all"] = filled_pages_error(fresh, kc, ends, sinks, page)
    fresh3 = torch.zeros_like(sums)
    refresh_bounds(kc, fresh3, ends - c, c, sinks=sinks, page=page)
    out["sums:refresh-all"] = sums_differ(fresh3, fresh)


def decode_cases(out: dict) -> None:
    torch.manual_seed(1)
    for group, sinks, wmax, window, positions in ((2, 2, 64, 16, [5, 40, 150]), (3, 4, 128, 32, [300, 77, 20]),
                                                  (1, 0, 64, 0, [200, 10, 64])):
        b, h_kv, d, page = len(positions), 2, 16, 16
        h, c = h_kv * group, sinks + wmax
        kc, vc = torch.randn(b, h_kv, c, d).to(DT), torch.randn(b, h_kv, c, d).to(DT)
        q, qs = torch.randn(b, h, d).to(DT), torch.randn(b, h, d).to(DT)
        k, v = torch.randn(b, h_kv, d).to(DT), torch.randn(b, h_kv, d).to(DT)
        pos = torch.tensor(positions)
        bounds = torch.from_numpy(page_bounds_np(kc.numpy(), pos.numpy(), sinks, page))
        n_pages = wmax // page
        answers = {}
        for pages in (0, 1, 3, n_pages):
            args = [t.numpy() for t in (q[:, :, None], qs[:, :, None], k[:, :, None], v[:, :, None], kc, vc)]
            want = cached_attention_np(*args, pos.numpy(), window, sinks=sinks, pages=pages, page=page,
                                       key_bounds=bounds.numpy())[:, :, 0]
            answers[pages] = want
            for splits in ((1, 4) if group == 2 else (2,)):
                got = budget_decode(q, qs, k, v, kc, vc, bounds, pos, torch.tensor(window), torch.tensor(pages),
                                    sinks=sinks, page=page, k_max=max(pages, 1), splits=splits)
                name = f"decode:g{group}-s{sinks}-w{window}-k{pages}-splits{splits}"
                out[name] = float(np.abs(got.double().numpy() - want).max())
        out[f"moves:g{group}-k1"] = float(np.abs(answers[1] - answers[0]).max())  # the pages change the answer
        sel = select_pages(q, bounds, pos, torch.tensor(window), torch.tensor(2), sinks=sinks, page=page, k_max=8)
        out[f"select:g{group}-k2-beyond-k"] = float((sel[:, 2:] != -1).sum())  # k = 2 of a list of 8: the rest -1
        small = torch.from_numpy(page_bounds_np(kc.numpy(), pos.numpy(), sinks, 2))  # pages of 2: 32 or 64 pages
        for pages in (3, 16):  # the spread scoring (programs of 16 pages, the last chooses) takes the same set
            args = (q, small, pos, torch.tensor(window), torch.tensor(pages))
            kw = dict(sinks=sinks, page=2, k_max=16)
            new = select_pages(*args, **kw, block_p=16, legacy=False).sort(1).values
            old = select_pages(*args, **kw, legacy=True).sort(1).values
            out[f"select:g{group}-k{pages}-same-set"] = float((new != old).sum())
            args = (q, with_sums(small), *args[2:])  # the sums kept: read instead of min and max, the same pages
            new3 = select_pages(*args, **kw, block_p=16, legacy=False).sort(1).values
            old3 = select_pages(*args, **kw, legacy=True).sort(1).values
            out[f"sums:g{group}-k{pages}-same-set"] = float((new3 != new).sum() + (old3 != old).sum())


def write_cases(out: dict) -> None:
    """budget_decode(write=True): the attention launch writes each stream's row and its page's bounds (1 and 4
    splits, through a ring wrap): the same output as without the write, ring_write_bounds' rows, and the bounds
    recomputed from the rows."""
    torch.manual_seed(2)
    b, h_kv, group, d, sinks, wmax, page = 2, 2, 2, 16, 2, 64, 2
    c = sinks + wmax
    kc, vc = torch.randn(b, h_kv, c, d).to(DT), torch.randn(b, h_kv, c, d).to(DT)
    pos = torch.tensor([0, 60])
    bounds = torch.from_numpy(page_bounds_np(kc.numpy(), pos.numpy(), sinks, page)).to(DT)
    kc3, vc3, sums = kc.clone(), vc.clone(), with_sums(bounds)
    diff = rows = worst = differ = 0.0
    for step in range(8):  # stream 0 writes sink rows, stream 1 wraps the ring of 64
        q, qs = torch.randn(b, h_kv * group, d).to(DT), torch.randn(b, h_kv * group, d).to(DT)
        k, v = torch.randn(b, h_kv, d).to(DT), torch.randn(b, h_kv, d).to(DT)
        args = (q, qs, k, v, kc, vc, bounds, pos, torch.tensor(8), torch.tensor(2))
        kw = dict(sinks=sinks, page=page, k_max=2, splits=1 if step % 2 else 4, block_p=16)  # 32 pages: 2 programs
        want = budget_decode(*args, **kw)
        got3 = budget_decode(q, qs, k, v, kc3, vc3, sums, *args[7:], **kw, write=True)  # the sums kept
        got = budget_decode(*args, **kw, write=True)
        differ += float((got3 != got).sum()) + sums_differ(sums, bounds)
        diff = max(diff, float((got.double() - want.double()).abs().max()))
        slots = RingLayout(sinks, wmax).slots(pos.numpy())
        rows += sum(not (torch.equal(kc[i, :, slots[i]], k[i]) and torch.equal(vc[i, :, slots[i]], v[i]))
                    for i in range(b))
        pos = pos + 1
        if step % 3 == 1 or step == 7:
            worst = max(worst, filled_pages_error(bounds, kc, pos, sinks, page))
    out["write:output-unchanged"] = diff
    out["write:rows-wrong"] = float(rows)
    out["write:bounds"] = worst
    out["sums:write"] = differ + float((kc3 != kc).sum())


def tie_case(out: dict) -> None:
    """Equal pages (the same keys): the lower page is chosen first."""
    b, h_kv, d, sinks, wmax, page = 1, 1, 16, 0, 64, 16
    kc = torch.ones(b, h_kv, sinks + wmax, d, dtype=DT)
    pos = torch.tensor([100])
    bounds = torch.from_numpy(page_bounds_np(kc.numpy(), pos.numpy(), sinks, page))
    sel = select_pages(torch.ones(b, 1, d, dtype=DT), bounds, pos, torch.tensor(16), torch.tensor(2), sinks=sinks,
                       page=page, k_max=2)
    # t = 100: ring offsets hold 36..99; candidates are pages with a row at p <= 84: all four pages
    out["select:ties-lower-first"] = float(sel[0].tolist() != [0, 1, -1, -1])


if __name__ == "__main__":
    import time

    results: dict[str, float] = {}
    for case in (bounds_cases, decode_cases, write_cases, tie_case):
        t0 = time.perf_counter()
        case(results)
        results[f"seconds:{case.__name__}"] = time.perf_counter() - t0
    print(json.dumps(results))
