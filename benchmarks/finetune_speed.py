"""Step time of the 2:4 distillation fine-tune (edgeattn.quantize.distillation, sparsity settings) by batch size.

    python benchmarks/finetune_speed.py --device cuda [--bf16]

Random-weight models with the shapes of MiniLM (BERT, 6 x 384) and SmolLM2-135M (Llama, 30 x 576,
vocabulary 49152), all Linear layers masked 2:4: step time does not depend on the weights, so nothing
needs to be loaded. Prints ms/step and tokens/s for each batch shape, to size batch and time budget.
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
import transformers

from edgeattn.quantize.sparsity.masks import sparsify_
from edgeattn.quantize.distillation import distill, sparsity_finetune

SHAPES = {"encoder": [(128, 48), (256, 48), (512, 48)], "decoder": [(32, 256), (64, 256), (32, 512)]}


def model(kind: str):
    if kind == "encoder":
        cfg = transformers.BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                                      intermediate_size=1536, max_position_embeddings=512)
        return transformers.BertModel(cfg, add_pooling_layer=False).eval()
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                                   num_key_value_heads=3, intermediate_size=1536, tie_word_embeddings=True,
                                   architectures=["LlamaForCausalLM"])
    return transformers.LlamaForCausalLM(cfg).eval()


def step_ms(kind: str, batch: int, seq: int, device: str, bf16: bool, steps: int) -> float:
    teacher = model(kind).to(device)
    student = copy.deepcopy(teacher)
    sparsify_(student)
    g = torch.Generator().manual_seed(0)

    def batches():
        while True:
            x = torch.randint(1000, 20000, (batch, seq), generator=g)
            yield {"input_ids": x, "attention_mask": torch.ones_like(x)}

    times = []
    for n in (10, 10 + steps):  # the first 10 steps warm up; the difference is `steps` steady steps
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        distill(student, teacher, batches(), kind, sparsity_finetune(kind, steps=n, bf16=bf16, device=device))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return (times[1] - times[0]) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--kinds", default="encoder,decoder")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows = []
    step_ms(args.kinds.split(",")[0], 8, 32, args.device, args.bf16, 2)  # process warm-up (CUDA init, libraries)
    for kind in args.kinds.split(","):
        for batch, seq in SHAPES[kind]:
            ms = step_ms(kind, batch, seq, args.device, args.bf16, args.steps)
            rows.append({"kind": kind, "batch": batch, "seq": seq, "ms_per_step": round(ms, 1),
                         "tokens_per_s": round(batch * seq / ms * 1e3)})
            print(f"{kind:8} batch {batch:4} x {seq:4}: {ms:7.1f} ms/step {rows[-1]['tokens_per_s']:9} tokens/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "bf16": args.bf16, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
