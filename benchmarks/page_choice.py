"""Which pages should a budget read? Retrieval under several page-scoring rules, one prefill per sample.

    .venv/bin/python benchmarks/page_choice.py --task multikey --context 4096 --samples 10 --budget 512
    python benchmarks/page_choice.py --task passkey --context 8192 --samples 50 --divisors 2,4,8,16 \
        --rules full,window,centre,exact --device cuda

SmolLM2-135M-Instruct (the packaged model) in PyTorch, fp32, greedy (the CPU by default; `--device cuda` on a
GPU). Each sample's prompt is read once with full attention (as `--prompt-attention whole`), then every rule decodes
the answer from that cache: the sink rows, a recent window of 25% of the other rows (in whole pages, as
AttentionBudget.from_total; `--recent`) and the k pages of 16 rows (`--page`) that the rule ranks highest per KV head (the
largest over its query heads), exact softmax attention over those rows. Positions are in order (the context is
below the ring), so page j holds positions sinks + 16j ... Every (rule, budget) pair decodes as one row of a batch
over the same prompt cache.

Rules: `full` (every row), `window` (sinks + the last budget - sinks rows), `bound` (Quest's upper bound,
sum_d max(q_d min_d, q_d max_d)), `centre` (q . (min + max) / 2: what edgeattn ships), `mean` (q . the mean key of
the page), `exact` (the page's largest true score q . k: the best a ranking by one score per page can do),
`mixNN` (the centre plus NN% of the bound's spread term, sum_d |q_d| (max_d - min_d) / 2: mix100 is the bound).
The sinks are scored at their true distance (what the op does under pages: min(t, sinks + W_max) with the
context below the ring); `--sinks frozen` scores them at sinks + W as a window does. Budgets: `--budget N` (default
context / 8), or `--divisors 2,4,8,16` for context / d each (the results are then named rule@budget). Writes
benchmarks/results/page_choice_{task}_{context}[_frozen_sinks][_pageN][_grid].json with every sample's answer.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

SINKS, PAGE = 4, 16
RULES = ("full", "window", "bound", "centre", "mean", "exact")
_PLAN: dict = {}  # the batch's modes as tensors (plan()); empty: every row reads everything (the prompt)


def page_scores(rule: str, qg, kp):
    """qg [B, H_kv, G, D], kp [B, H_kv, P, PAGE, D] -> scores [B, H_kv, G, P]."""
    lo, hi = kp.amin(3), kp.amax(3)
    if rule == "bound":
        return qg.clamp(min=0) @ hi.transpose(-1, -2) + qg.clamp(max=0) @ lo.transpose(-1, -2)
    if rule == "centre":
        return qg @ ((lo + hi) / 2).transpose(-1, -2)
    if rule == "mean":
        return qg @ kp.mean(3).transpose(-1, -2)
    if rule == "exact":
        return torch.einsum("bhgd,bhprd->bhgpr", qg, kp).amax(-1)
    if rule.startswith("mix"):  # mixNN: the centre plus NN% of the bound's spread term (mix100 is the bound)
        spread = float(rule[3:]) / 100
        return qg @ ((lo + hi) / 2).transpose(-1, -2) + spread * (qg.abs() @ ((hi - lo) / 2).transpose(-1, -2))
    raise ValueError(rule)


RECENT = 0.25  # the recent window's share of the non-sink rows (edgeattn's default, --budget-recent)


def window_and_pages(budget: int) -> tuple[int, int]:
    """The page rules' split of `budget` rows: the recent window (RECENT of the non-sink rows, whole pages) and k."""
    free = budget - SINKS
    window = min(max(PAGE, PAGE * math.floor(RECENT * free / PAGE + 0.5)), PAGE * (free // PAGE))
    return window, (free - window) // PAGE


def plan(modes: list[dict], device) -> dict:
    """The modes as batch tensors: window [B], pages [B], full [B], and per page rule the rows that use it."""
    rules = {m["rule"] for m in modes} - {"full", "window"}
    return {"window": torch.tensor([m["window"] for m in modes], device=device),
            "pages": torch.tensor([m["pages"] for m in modes], device=device),
            "full": torch.tensor([m["rule"] == "full" for m in modes], device=device),
            "frozen": torch.tensor([m["sink_rule"] == "frozen" and m["rule"] != "full" for m in modes], device=device),
            "rules": {r: torch.tensor([m["rule"] == r for m in modes], device=device) for r in sorted(rules)}}


def read_mask(q, key, p: dict):
    """q [B, H, D], key [B, H_kv, T, D] (T includes the new token) -> [B, H, T], the rows each batch row reads."""
    b, h, d = q.shape
    _, hkv, t, _ = key.shape
    g = h // hkv
    dev = q.device
    w, k = p["window"], p["pages"]
    pos = torch.arange(t, device=dev)
    old = t - w  # [B]: candidates are positions SINKS .. old - 1
    mask = ((pos < SINKS)[None] | (pos[None] >= old[:, None]))[:, None].expand(b, hkv, t).clone()  # [B, H_kv, T]
    npages = math.ceil((t - SINKS) / PAGE)
    if npages > 0 and int(k.max()) > 0:
        kp = key[:, :, SINKS:]
        if kp.shape[2] < npages * PAGE:  # the last page holds window rows too: its bounds cover every filled row
            kp = torch.cat([kp, kp[:, :, -1:].expand(-1, -1, npages * PAGE - kp.shape[2], -1)], 2)
        kp = kp.reshape(b, hkv, npages, PAGE, d)
        qg = q.reshape(b, hkv, g, d)
        score = torch.zeros(b, hkv, npages, device=dev, dtype=q.dtype)
        for rule, rows in p["rules"].items():
            score = torch.where(rows[:, None, None], page_scores(rule, qg, kp).amax(2), score)
        start = SINKS + PAGE * torch.arange(npages, device=dev)
        score = score.masked_fill(~(start[None] < old[:, None])[:, None], float("-inf"))
        top = score.topk(min(int(k.max()), npages), dim=-1)
        take = (torch.arange(top.indices.shape[-1], device=dev)[None] < k[:, None])[:, None] & (top.values > float("-inf"))
        chosen = torch.zeros(b, hkv, npages, dtype=torch.bool, device=dev).scatter_(-1, top.indices, take)
        rows = chosen.repeat_interleave(PAGE, -1)[..., :t - SINKS] & (pos[SINKS:][None] < old[:, None])[:, None]
        mask[..., SINKS:] |= rows
    return mask.repeat_interleave(g, 1) | p["full"][:, None, None]


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    b, h, s, d = query.shape
    g = h // key.shape[1]
    kx, vx = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
    scaling = scaling or d ** -0.5
    if s > 1 or not _PLAN:  # the prompt: full causal attention
        out = torch.nn.functional.scaled_dot_product_attention(query, kx, vx, is_causal=s > 1, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    scores = (query @ kx.transpose(-1, -2)) * scaling  # [B, H, 1, T]
    t = key.shape[2] - 1  # the query's position
    frozen = _PLAN["frozen"] & (t > SINKS + _PLAN["window"])  # [B]
    if bool(frozen.any()):
        # edgeattn's earlier sink rule: the sinks scored with q rotated at min(t, sinks + W), W the recent window
        theta = getattr(module.config, "rope_theta", None) or module.config.rope_parameters["rope_theta"]
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=query.device) / d)
        ang = (SINKS + _PLAN["window"] - t).double()[:, None] * inv[None]  # [B, D/2]
        cos = torch.cat([ang.cos(), ang.cos()], -1).float()[:, None, None]
        sin = torch.cat([ang.sin(), ang.sin()], -1).float()[:, None, None]
        half = torch.cat([-query[..., d // 2:], query[..., :d // 2]], -1)
        sink_scores = ((query * cos + half * sin) @ kx[:, :, :SINKS].transpose(-1, -2)) * scaling
        scores[..., :SINKS] = torch.where(frozen[:, None, None, None], sink_scores, scores[..., :SINKS])
    mask = read_mask(query[:, :, 0], key, _PLAN)
    scores = scores.masked_fill(~mask[:, :, None, :], float("-inf"))
    out = torch.softmax(scores.float(), -1).to(value.dtype) @ vx
    return out.transpose(1, 2).contiguous(), None


def main() -> None:
    global PAGE, RECENT
    import transformers

    from edgeattn.evaluation.scoring import score
    from edgeattn.evaluation.tasks import get_task, make_samples
    from edgeattn.hf_models import resolve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="passkey")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--budget", type=int, help="rows in all (default: context / 8)")
    ap.add_argument("--divisors", help="budgets of context / d for each d (e.g. 2,4,8,16), instead of --budget")
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--sinks", choices=("true", "frozen"), default="true",
                    help="sink distances under a window or budget: true, or edgeattn's (frozen at sinks + W)")
    ap.add_argument("--page", type=int, default=PAGE, help="rows a page (edgeattn's default 16)")
    ap.add_argument("--recent", type=float, default=RECENT, help="the recent window's share of the non-sink rows")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    PAGE, RECENT = args.page, args.recent
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 products, as on the CPU
    if args.divisors and args.budget:
        ap.error("--budget or --divisors, not both")
    budgets = [args.context // int(x) for x in args.divisors.split(",")] if args.divisors else \
        [args.budget or args.context // 8]
    rules = args.rules.split(",")
    unknown = sorted(r for r in set(rules) - set(RULES) if not (r.startswith("mix") and r[3:].isdigit()))
    if unknown:
        ap.error(f"--rules: expected some of {', '.join(RULES)}, found {', '.join(unknown)}")
    modes = []
    for budget in budgets:
        window, pages = window_and_pages(budget)
        for r in rules:
            if r == "full" and any(m["rule"] == "full" for m in modes):
                continue
            label = r if len(budgets) == 1 or r == "full" else f"{r}@{budget}"
            modes.append({"rule": r, "label": label, "budget": budget, "sink_rule": args.sinks,
                          "window": budget - SINKS if r == "window" else window,
                          "pages": 0 if r in ("full", "window") else pages})
    transformers.AttentionInterface.register("page_choice", attention)
    path = resolve("smollm2")
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="page_choice",
                                                              dtype=torch.float32).eval().to(args.device)
    samples = make_samples(args.task, args.context, args.samples, lambda m: len(tok(m).input_ids), form="raw")
    new = get_task(args.task).max_tokens
    batch = plan(modes, args.device)
    rows = []
    for smp in samples:
        ids = tok(smp.message, return_tensors="pt").input_ids.to(args.device)
        t0 = time.perf_counter()
        _PLAN.clear()
        with torch.no_grad():
            out = model(ids, use_cache=True)
            cache = out.past_key_values
            cache.batch_repeat_interleave(len(modes))
            tokens = [out.logits[0, -1].argmax().repeat(len(modes))]
            _PLAN.update(batch)
            for _ in range(new - 1):
                step = model(tokens[-1][:, None], past_key_values=cache, use_cache=True)
                cache = step.past_key_values
                tokens.append(step.logits[:, -1].argmax(-1))
        generated = torch.stack(tokens, 1).tolist()
        row = {"index": smp.index, "depth": smp.depth, "prompt_tokens": int(ids.shape[1]), "answers": list(smp.answers),
               "texts": {}, "correct": {}}
        for mode, seq in zip(modes, generated):
            text = tok.decode(seq)
            row["texts"][mode["label"]], row["correct"][mode["label"]] = text, score(smp.answers, text)
        row["seconds"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        marks = " ".join(f"{r}={'Y' if ok else 'n'}" for r, ok in row["correct"].items())
        print(f"sample {smp.index} ({row['seconds']} s): {marks}", flush=True)
    accuracy = {m["label"]: sum(r["correct"][m["label"]] for r in rows) / len(rows) for m in modes}
    splits = ", ".join(f"{b}: window {window_and_pages(b)[0]} + {window_and_pages(b)[1]} pages" for b in budgets)
    print(f"{args.task} at {args.context} tokens, budgets ({splits} for the page rules), {len(rows)} samples: "
          + ", ".join(f"{k} {v:.2f}" for k, v in accuracy.items()))
    tail = ("" if args.sinks == "true" else "_frozen_sinks") + ("" if PAGE == 16 else f"_page{PAGE}") + \
        ("_grid" if args.divisors else "")
    out_path = args.out or Path(__file__).parent / "results" / f"page_choice_{args.task}_{args.context}{tail}.json"
    device = torch.cuda.get_device_name() if str(args.device).startswith("cuda") else "cpu"
    out_path.write_text(json.dumps({"task": args.task, "context": args.context, "budgets": budgets,
                                    "budget": budgets[0], "window": window_and_pages(budgets[0])[0],
                                    "sinks": args.sinks, "page": PAGE, "recent": RECENT, "device": device,
                                    "modes": modes, "accuracy": accuracy, "threads": args.threads,
                                    "samples": rows}, indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
