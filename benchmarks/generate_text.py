"""Write distillation text sampled from a causal LM (default SmolLM2-135M-Instruct), one document a line.

    python benchmarks/generate_text.py --docs 8192 --out gen.txt --device cuda

Genres x topics of `edgeattn.quantize.generated_text`; the file feeds `sparse_quality.py --text-file`
and `edgeattn sparsify --calib`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from edgeattn import hf_models
from edgeattn.quantize.generated_text import generate_documents, write_documents


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 or a Hugging Face causal-LM folder")
    parser.add_argument("--docs", type=int, default=1024)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    model, tok, kind = hf_models.load(args.model, attn_implementation="sdpa")
    if kind != "decoder":
        raise SystemExit(f"{args.model}: expected a causal LM, found an encoder")
    model = model.to(args.device, torch.bfloat16 if args.device.startswith("cuda") else torch.float32)
    t0 = time.time()
    docs = generate_documents(model, tok, args.docs, max_new_tokens=args.max_new_tokens, batch=args.batch,
                              seed=args.seed, progress=lambda m: print(m, flush=True))
    write_documents(docs, args.out)
    words = sum(len(d.split()) for d in docs)
    print(f"{len(docs)} documents, {words} words in {time.time() - t0:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
