"""Which pages should a budget read? Retrieval under several page-scoring rules, one prefill per sample.

    .venv/bin/python benchmarks/page_choice.py --task multikey --context 4096 --samples 10 --budget 512

SmolLM2-135M-Instruct (the packaged model) in PyTorch on the CPU, greedy. Each sample's prompt is read once with
full attention (as `--prompt-attention whole`), then every rule decodes the answer from a copy of that cache: the
sink rows, a recent window of 25% of the other rows (in whole pages, as AttentionBudget.from_total) and the k pages
of 16 rows (`--page`) that the rule ranks highest per KV head (the largest over its query heads), exact softmax
attention over those rows. Positions are in order (the context is below the ring), so page j holds positions
sinks + 16j ...

Rules: `full` (every row), `window` (sinks + the last budget - sinks rows), `bound` (Quest's upper bound,
sum_d max(q_d min_d, q_d max_d)), `centre` (q . (min + max) / 2: what edgeattn ships), `mean` (q . the mean key of
the page), `exact` (the page's largest true score q . k: the best a ranking by one score per page can do).
The sinks are scored at their true distance (what the op does under pages: min(t, sinks + W_max) with the
context below the ring); `--sinks frozen` scores them at sinks + W as a window does. Writes
benchmarks/results/page_choice_{task}_{context}[_frozen_sinks].json with every sample's answer.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import torch

SINKS, PAGE = 4, 16
RULES = ("full", "window", "bound", "centre", "mean", "exact")
_MODE: dict = {"rule": "full"}


def page_scores(rule: str, qg, kp):
    """qg [H_kv, G, D], kp [H_kv, P, PAGE, D] -> scores [H_kv, G, P]."""
    lo, hi = kp.amin(2), kp.amax(2)
    if rule == "bound":
        return qg.clamp(min=0) @ hi.transpose(1, 2) + qg.clamp(max=0) @ lo.transpose(1, 2)
    if rule == "centre":
        return qg @ ((lo + hi) / 2).transpose(1, 2)
    if rule == "mean":
        return qg @ kp.mean(2).transpose(1, 2)
    if rule == "exact":
        return torch.einsum("hgd,hprd->hgpr", qg, kp).amax(-1)
    raise ValueError(rule)


def read_mask(q, key, mode: dict):
    """q [H, D], key [H_kv, T, D] (T includes the new token) -> [H, T] rows read, or None (every row)."""
    rule, w, k = mode["rule"], mode["window"], mode["pages"]
    if rule == "full":
        return None
    h, d = q.shape
    hkv, t, _ = key.shape
    mask = torch.zeros(h, t, dtype=torch.bool)
    mask[:, :SINKS] = True
    mask[:, max(SINKS, t - w):] = True
    old = t - w  # candidates: positions SINKS .. old - 1
    npages = max(0, math.ceil((old - SINKS) / PAGE))
    if rule == "window" or k == 0 or npages == 0:
        return mask
    kp = key[:, SINKS:SINKS + npages * PAGE]
    if kp.shape[1] < npages * PAGE:  # the last page holds window rows too: its bounds cover every filled row
        kp = torch.cat([kp, kp[:, -1:].expand(-1, npages * PAGE - kp.shape[1], -1)], 1)
    kp = kp.reshape(hkv, npages, PAGE, d)
    score = page_scores(rule, q.reshape(hkv, h // hkv, d), kp).amax(1)  # [H_kv, P]
    chosen = torch.zeros(hkv, npages, dtype=torch.bool)
    chosen.scatter_(1, score.topk(min(k, npages), dim=-1).indices, True)
    rows = chosen.repeat_interleave(h // hkv, 0).repeat_interleave(PAGE, 1)[:, :old - SINKS]
    mask[:, SINKS:old] |= rows
    return mask


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    b, h, s, d = query.shape
    g = h // key.shape[1]
    kx, vx = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
    scaling = scaling or d ** -0.5
    if s > 1:  # the prompt: full causal attention
        out = torch.nn.functional.scaled_dot_product_attention(query, kx, vx, is_causal=True, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    scores = (query @ kx.transpose(-1, -2)) * scaling  # [1, H, 1, T]
    t = key.shape[2] - 1  # the query's position
    if _MODE.get("sink_rule") == "frozen" and _MODE["rule"] != "full" and t > SINKS + _MODE["window"]:
        # edgeattn's sink rule: the sinks scored with q rotated at min(t, sinks + W), W the recent window
        theta = getattr(module.config, "rope_theta", None) or module.config.rope_parameters["rope_theta"]
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        ang = (SINKS + _MODE["window"] - t) * inv
        cos, sin = torch.cat([ang.cos(), ang.cos()]).float(), torch.cat([ang.sin(), ang.sin()]).float()
        half = torch.cat([-query[..., d // 2:], query[..., :d // 2]], -1)
        q_sink = query * cos + half * sin
        scores[..., :SINKS] = (q_sink @ kx[:, :, :SINKS].transpose(-1, -2)) * scaling
    mask = read_mask(query[0, :, 0], key[0], _MODE)
    if mask is not None:
        scores = scores.masked_fill(~mask[None, :, None, :], float("-inf"))
    out = torch.softmax(scores.float(), -1).to(value.dtype) @ vx
    return out.transpose(1, 2).contiguous(), None


def main() -> None:
    global PAGE
    import transformers

    from edgeattn.evaluation.scoring import score
    from edgeattn.evaluation.tasks import get_task, make_samples
    from edgeattn.hf_models import resolve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="passkey")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--budget", type=int, help="rows in all (default: context / 8)")
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--sinks", choices=("true", "frozen"), default="true",
                    help="sink distances under a window or budget: true, or edgeattn's (frozen at sinks + W)")
    ap.add_argument("--page", type=int, default=PAGE, help="rows a page (edgeattn's default 16)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    PAGE = args.page
    torch.set_num_threads(args.threads)
    budget = args.budget or args.context // 8
    free = budget - SINKS
    window = min(max(PAGE, PAGE * math.floor(0.25 * free / PAGE + 0.5)), PAGE * (free // PAGE))
    pages = (free - window) // PAGE
    modes = [{"rule": r, "sink_rule": args.sinks, "window": budget - SINKS if r == "window" else window,
              "pages": 0 if r in ("full", "window") else pages} for r in args.rules.split(",")]
    transformers.AttentionInterface.register("page_choice", attention)
    path = resolve("smollm2")
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="page_choice",
                                                              dtype=torch.float32).eval()
    samples = make_samples(args.task, args.context, args.samples, lambda m: len(tok(m).input_ids), form="raw")
    new = get_task(args.task).max_tokens
    rows = []
    for smp in samples:
        ids = tok(smp.message, return_tensors="pt").input_ids
        t0 = time.perf_counter()
        _MODE.update(rule="full")
        with torch.no_grad():
            out = model(ids, use_cache=True)
        row = {"index": smp.index, "depth": smp.depth, "answers": list(smp.answers), "texts": {}, "correct": {}}
        for mode in modes:
            _MODE.clear()
            _MODE.update(mode)
            cache, tokens = copy.deepcopy(out.past_key_values), [int(out.logits[0, -1].argmax())]
            with torch.no_grad():
                for _ in range(new - 1):
                    step = model(torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
                    cache = step.past_key_values
                    tokens.append(int(step.logits[0, -1].argmax()))
            text = tok.decode(tokens)
            row["texts"][mode["rule"]], row["correct"][mode["rule"]] = text, score(smp.answers, text)
        row["seconds"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        marks = " ".join(f"{r}={'Y' if ok else 'n'}" for r, ok in row["correct"].items())
        print(f"sample {smp.index} ({row['seconds']} s): {marks}", flush=True)
    accuracy = {m["rule"]: sum(r["correct"][m["rule"]] for r in rows) / len(rows) for m in modes}
    print(f"{args.task} at {args.context} tokens, budget {budget} (window {window} + {pages} pages "
          f"for the page rules), {len(rows)} samples: " + ", ".join(f"{k} {v:.2f}" for k, v in accuracy.items()))
    tail = ("" if args.sinks == "true" else "_frozen_sinks") + ("" if PAGE == 16 else f"_page{PAGE}")
    out_path = args.out or Path(__file__).parent / "results" / f"page_choice_{args.task}_{args.context}{tail}.json"
    out_path.write_text(json.dumps({"task": args.task, "context": args.context, "budget": budget, "window": window,
                                    "sinks": args.sinks, "page": PAGE,
                                    "modes": modes, "accuracy": accuracy, "threads": args.threads,
                                    "samples": rows}, indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
