"""Quality of 2:4 pruning with mask-preserving fine-tuning (and, with --qat, W8A8 QAT on top).

    python benchmarks/sparse_quality.py minilm --steps 300
    python benchmarks/sparse_quality.py smollm2 --steps 250

MiniLM: mean / min cosine of sentence embeddings (masked mean pooling, L2-normalised) to the dense
fp32 model on the 200 held-out pang_lee_polarity sentences (never trained on). Target >= 0.97 (2:4 +
fine-tune), >= 0.96 (2:4 + W8A8 QAT). SmolLM2: perplexity on the last 30 lee_background documents (the
fine-tune uses the first 270), target within +25% of the dense model. MiniLM also reports the cosine on the
sentences of those 30 held-out news documents (`news_cosine_mean`), a second domain never trained on.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from edgeattn import hf_models
from edgeattn.quantize.distillation import distill, sparsity_finetune
from edgeattn.quantize.fidelity import embeddings as pooled_embeddings
from edgeattn.quantize.fidelity import torch_forward
from edgeattn.quantize.sparsity.masks import SparsityConfig, is_two_four, masked_layers, sparsify_
from edgeattn.text import eval_batches, polarity_sentences, read_texts, stream_batches
from edgeattn.text import sentences as data_sentences

HELD_OUT_DOCS = 30


def stdlib_docstrings(limit_chars: int = 8_000_000) -> list[str]:
    """Prose docstrings of the standard library's modules (parsed with ast, nothing imported)."""
    import ast
    import re
    import sysconfig

    out, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="ignore"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node) or ""
                sents = [" ".join(x.split()) for x in re.split(r"(?<=[.!?])\s+", doc)]
                sents = [x.rstrip(".") for x in sents if 5 <= len(x.split()) <= 60 and not re.search(r"[>{}=\[\]]|\(\)", x)]
                if sents:
                    out.append(". ".join(sents) + ".")
                    total += len(out[-1])
        if total > limit_chars:
            break
    return out


def pydoc_documents() -> list[str]:
    """English prose from the standard library's pydoc_data topics, as '. '-joined documents (no code lines)."""
    import re

    from pydoc_data.topics import topics

    out = []
    for text in topics.values():
        sents = [" ".join(x.split()) for x in re.split(r"(?<=[.!?])\s+", text)]
        sents = [x.rstrip(".") for x in sents if 5 <= len(x.split()) <= 60 and not re.search(r"[>{}=\[\]]|\(\)", x)]
        if sents:
            out.append(". ".join(sents) + ".")
    return out


def embeddings(model, tok, sentences: list[str]) -> torch.Tensor:
    """Normalised mean-pooled sentence embeddings [N, H] (edgeattn.quantize.fidelity), 32 sentences a batch."""
    run, device = torch_forward(model, "encoder"), next(model.parameters()).device
    return pooled_embeddings(lambda b: run({k: v.to(device) for k, v in b.items()}).cpu(),
                             eval_batches(tok, sentences, 32, 128))


@torch.no_grad()
def perplexity(model, tok, docs: list[str], seq_len: int = 512) -> float:
    ids = torch.tensor([t for d in docs for t in tok(d)["input_ids"]])
    nll, count = 0.0, 0
    for s in range(0, len(ids) - 1, seq_len):
        x = ids[s:s + seq_len + 1].unsqueeze(0).to(next(model.parameters()).device)
        if x.shape[1] < 2:
            break
        logits = model(input_ids=x[:, :-1], use_cache=False).logits
        nll += torch.nn.functional.cross_entropy(logits[0], x[0, 1:], reduction="sum").item()
        count += x.shape[1] - 1
    return float(torch.exp(torch.tensor(nll / count)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="minilm, smollm2, or a Hugging Face folder")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (pruning, fine-tuning and evaluation)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--permute", action="store_true")
    parser.add_argument("--method", choices=["magnitude", "calibrated", "sequential"], default="calibrated")
    parser.add_argument("--calib-batches", type=int, default=16)
    parser.add_argument("--qat", action="store_true", help="then W8A8 QAT (edgeattn.quantize, issue 4), masks kept")
    parser.add_argument("--qat-steps", type=int, default=150)
    parser.add_argument("--eval-docs", type=int, default=HELD_OUT_DOCS, help="held-out documents for perplexity")
    parser.add_argument("--time-budget-s", type=float, default=None,
                        help="stop the fine-tune after this many seconds (the learning rate decays over them)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA)")
    parser.add_argument("--extra-text", choices=["none", "pydoc", "stdlib"], default="none",
                        help="add English sentences from Python's bundled documentation (pydoc_data), or also "
                             "the standard library's docstrings (stdlib), to the fine-tuning text")
    parser.add_argument("--text-file", type=Path, action="append", default=[],
                        help="more fine-tuning text, one document a line (e.g. from `edgeattn distill-text`)")
    parser.add_argument("--repeat-train-docs", type=int, default=1,
                        help="use the lee_background training documents this many times in the fine-tuning text "
                             "(weights the evaluated domain; the held-out documents are never trained on)")
    parser.add_argument("--train-embeddings", action="store_true", help="also train the embedding tables")
    parser.add_argument("--cosine-weight", type=float, default=1.0, help="weight of the pooled-cosine loss term")
    parser.add_argument("--length-grouping", type=int, default=16,
                        help="encoders: batches cut from a pool of this many sorted by length (1: random batches)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    # sdpa attention for training: SmolLM2 32 x 256 took 209 ms a step on the H200 with eager attention, and
    # 101 ms in finetune_speed.py with sdpa (random tokens; attention is the main difference between the two)
    dense, tok, kind = hf_models.load(args.model, attn_implementation="sdpa")
    student = copy.deepcopy(dense)
    docs = read_texts()
    train_docs, eval_docs = docs[:-HELD_OUT_DOCS], docs[-HELD_OUT_DOCS:][:args.eval_docs]
    ft = sparsity_finetune(kind, steps=args.steps, lr=args.lr, time_budget_s=args.time_budget_s, bf16=args.bf16,
                           train_embeddings=args.train_embeddings, device=args.device,
                           output_weight=1.0 if kind == "decoder" else args.cosine_weight)
    batching = dict(batch_size=args.batch, seq_len=args.seq_len, length_grouping=args.length_grouping)
    if args.repeat_train_docs < 1:
        parser.error(f"--repeat-train-docs: expected >= 1, found {args.repeat_train_docs}")
    train_text = train_docs * args.repeat_train_docs
    train_text += pydoc_documents() if args.extra_text in ("pydoc", "stdlib") else []
    train_text += stdlib_docstrings() if args.extra_text == "stdlib" else []
    for path in args.text_file:
        train_text += read_texts(path)
    print(f"fine-tuning text: {len(train_text)} documents", flush=True)
    calib = stream_batches(tok, train_docs, kind, batch_size=8, seq_len=args.seq_len, seed=1,
                           length_grouping=args.length_grouping)
    calib = [next(calib) for _ in range(args.calib_batches)]
    t0 = time.time()
    student.to(args.device)  # calibrated pruning runs where the model is
    report = sparsify_(student, SparsityConfig(policy="all", permute=args.permute, method=args.method),
                       calibration=calib)
    dense.to(args.device)
    student.to(args.device)
    print(f"pruned {len(report.pruned)} Linear layers 2:4 ({args.method}, {time.time() - t0:.0f} s); "
          f"skipped: {json.dumps(report.as_dict()['skipped'])}")
    sentences = polarity_sentences()
    figures: dict = {"model": args.model, "method": args.method, "pruned_layers": len(report.pruned),
                     "text": {"documents": len(train_text), "repeat_train_docs": args.repeat_train_docs,
                              "extra_text": args.extra_text, "text_files": [p.name for p in args.text_file]}}

    def measure(label: str, model) -> None:
        if kind == "decoder":
            figures[label] = {"perplexity": perplexity(model, tok, eval_docs)}
        else:
            cos = (embeddings(model, tok, sentences) * reference).sum(-1)
            news = (embeddings(model, tok, news_sentences) * news_reference).sum(-1)
            figures[label] = {"cosine_mean": cos.mean().item(), "cosine_min": cos.min().item(),
                              "news_cosine_mean": news.mean().item()}
        print(f"{label:28} {json.dumps(figures[label])}", flush=True)

    reference = None if kind == "decoder" else embeddings(dense, tok, sentences)
    news_sentences = data_sentences(eval_docs, min_words=4)[:400]  # held-out news (never trained on): a second domain
    news_reference = None if kind == "decoder" else embeddings(dense, tok, news_sentences)
    measure("dense fp32", dense)
    measure("2:4 pruned, no fine-tune", student)
    t0 = time.time()
    result = distill(student, dense, stream_batches(tok, train_text, kind, **batching), kind, ft, log=print)
    figures["finetune"] = {**result.section(ft), "config": {**ft.as_dict(), **batching}}
    measure("2:4 + fine-tune", student)
    ok = all(is_two_four(m.weight) for m in masked_layers(student).values())
    print(f"all {len(masked_layers(student))} masked weights still 2:4 after fine-tuning: {ok} "
          f"({time.time() - t0:.0f} s)")
    if kind == "decoder":
        rel = figures["2:4 + fine-tune"]["perplexity"] / figures["dense fp32"]["perplexity"] - 1
        print(f"perplexity change: {rel:+.1%} (target <= +25%)")
    if args.qat:
        from edgeattn.quantize.sparsity.qat import qat_after_sparsity

        student.cpu()  # quantize_ and calibrate run on the CPU; distillation moves both models to CUDA if present
        dense.cpu()
        figures["qat"] = qat_after_sparsity(student, dense, tok, kind, train_text, args.qat_steps)
        print(f"QAT: {json.dumps(figures['qat']['masks_kept'])} masks kept")
        measure("2:4 + W8A8 QAT", student)
        ok = all(is_two_four(m.weight) for m in masked_layers(student).values())
        print(f"masked weights still 2:4 after QAT: {ok}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
