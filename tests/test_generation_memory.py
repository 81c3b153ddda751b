"""A long stream through a ring keeps memory flat: the KV cache's bytes never change, and neither the Python
heap (what Python and numpy allocate; ONNX Runtime's output buffers are not traced) nor the process's resident memory grows with the stream.

Runs `benchmarks/generation_streams.py memory` in its own process (so the resident memory is the stream's,
not pytest's) on the tiny decoder fixture: 5,000 tokens through a ring of 44 rows, 100 times the ring.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from decoder_fixtures import SINKS, requires_decoder_stack

pytestmark = requires_decoder_stack

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "generation_streams.py"
TOKENS, CHUNK, RING, EVERY = 5000, 32, 44, 1000


def _memory_run(bundle: Path) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), "memory", "--bundle", str(bundle), "--tokens", str(TOKENS),
                           "--chunk", str(CHUNK), "--window", str(RING), "--every", str(EVERY), "--threads", "1",
                           "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cache_bytes_and_memory_stay_flat_over_a_long_stream(tiny_decoder):
    _, _, _, bundle = tiny_decoder
    result = _memory_run(bundle)
    samples = result["samples"]
    tokens = [s["tokens"] for s in samples]  # sampled as the stream passes each 1,000 tokens
    assert tokens[0] == 0 and tokens[-1] == TOKENS and len(tokens) == TOKENS // EVERY + 1 and tokens == sorted(tokens)
    # the cache: allocated once, sinks + ring rows, the same bytes from the first token to the last
    layers, kv_heads, head_dim = 2, 2, 16  # decoder_fixtures.tiny_llama
    want = 2 * layers * kv_heads * (SINKS + RING) * head_dim * 4
    assert {s["cache_bytes"] for s in samples} == {want}
    assert samples[-1]["held_tokens"] == SINKS + RING
    # after the first 1,000 tokens (sessions warm, the ring full). Keeping each step's outputs (ONNX Runtime's
    # buffers: logits [1, 32, 49152] float32, 6 MB a step) added 770 MiB of RSS over these 5,000 tokens when
    # tried; a numpy copy of each token's keys and values (512 bytes a token, 2 MB) shows in the traced heap
    warm, last = samples[1], samples[-1]
    assert last["python_heap_bytes"] - warm["python_heap_bytes"] < 256 * 1024
    assert last["rss_kib"] - warm["rss_kib"] < 48 * 1024
