"""FP8 perplexity on the CPU: the cuda target's own prefill (runtime/cuda/prefill.py) on CPU tensors, bf16
against FP8 weights rounded with error feedback (GPTQ, the build's default) and to nearest, and against the
FP8 cache (`--variants bf16,fp8_cache,fp8_both`: attention reads every row as the cache keeps it).

    python benchmarks/fp8_h200.py pack --out .fp8pay                 # SmolLM2-135M's weights and token ids
    python benchmarks/fp8_quality_cpu.py --payload .fp8pay --out benchmarks/results/fp8_quality_cpu.json

The text is fp8_h200.py's: lee.cor (held out) in chunks of 512 tokens, every prediction of a chunk scored from
one prefill (the GPU run scores the same tokens with decode steps that read the cache; the same arithmetic up
to the order of the sums). The weights' calibration is the build's default text (16 lee_background documents).
FP8 products run in bf16 on the FP8-rounded weights here, as the choice table has the H200 do for SmolLM2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import fp8_h200  # noqa: E402


def flat_payload(folder: Path) -> Path:
    """pack's two pieces (a/, b/) seen as the one folder load_payload reads."""
    if (folder / "meta.json").is_file():
        return folder
    flat = folder / "joined"
    flat.mkdir(exist_ok=True)
    for piece in ("a", "b"):
        for f in (folder / piece).iterdir():
            link = flat / f.name
            if not link.exists():
                link.symlink_to(f.resolve())
    return flat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payload", type=Path, required=True, help="pack's output folder")
    ap.add_argument("--chunks", type=int, default=0, help="chunks of 512 tokens (0: all of the held-out text)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default="bf16,fp8_weights,fp8_weights_nearest",
                    help="a comma list of bf16, fp8_weights, fp8_weights_nearest, fp8_cache, fp8_both")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from edgeattn.runtime.cuda.prefill import prefill_logits

    torch.set_num_threads(args.threads)
    t0 = time.time()
    meta, tensors, build = fp8_h200.load_payload(flat_payload(args.payload), torch.device("cpu"))
    ws, _ = fp8_h200.variants(tensors, build, meta["calibration"], meta["weight_calibration"], nearest=True)
    chunks = args.chunks or len(meta["heldout"]) // 512
    held = torch.tensor(meta["heldout"][:chunks * 512]).reshape(chunks, 512)
    ppl = {}
    names = ["bf16"] + [n for n in args.variants.split(",") if n and n != "bf16"]
    unknown = set(names) - set(ws)
    if unknown:
        ap.error(f"--variants: expected names from {sorted(ws)}, found {sorted(unknown)}")
    for name in names:
        nll = 0.0
        with torch.no_grad():
            for chunk in held:
                keys, values = ws[name].new_cache(1)
                logits = prefill_logits(ws[name], chunk, 0, 0, keys, values, 0, last_only=False).float()
                nll += float(torch.nn.functional.cross_entropy(logits[:-1], chunk[1:], reduction="sum"))
        ppl[name] = round(math.exp(nll / (chunks * 511)), 3)
        print(f"{name:22s} perplexity {ppl[name]:8.3f}  {100 * (ppl[name] / ppl['bf16'] - 1):+.2f}% "
              f"({time.time() - t0:.0f} s)", flush=True)
    res = {"what": "FP8 perplexity on the CPU (cuda target's prefill, CPU tensors, bf16)",
           "text": f"lee.cor (held out), {chunks} chunks of 512 tokens", "perplexity": ppl,
           "vs_bf16_pct": {k: round(100 * (v / ppl["bf16"] - 1), 2) for k, v in ppl.items() if k != "bf16"},
           "calibration_tokens": sum(len(ids) for ids in meta["weight_calibration"]), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d")}
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    sys.exit(main())
