"""Runs the fused decode kernels (plugins/kernels/fused_decode.py) under TRITON_INTERPRET=1 on CPU tensors, float32,
against the eager step's pieces (runtime/cuda/decode_step.py), and prints one JSON line: check name -> error.

Started as its own process by tests/test_fused_decode.py: the variable must be set before the kernels are decorated,
and the AOT tests in the main process need the compiling Triton. Errors are max |fused - reference| / max |reference|
(token checks: the number of disagreeing steps).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from unittest import mock

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import transformers  # noqa: E402

from edgeattn.plugins.kernels import fused_decode as fk  # noqa: E402
from edgeattn.runtime.cuda import decode_step as ds  # noqa: E402

F = torch.nn.functional


def tiny(model_type: str, seed: int = 0):
    """2 layers, hidden 128, 4 heads over 2 kv heads of 32 (the kernels' tl.dot wants a half head of >= 16)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=200, hidden_size=128, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-5,
                  eos_token_id=None)
    kinds = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
             "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
             "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}
    config, model = kinds[model_type]
    model = model(config(**common)).eval()
    with torch.no_grad():  # biases start at zero: make them count
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def rel(a, b) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


TILES = {"gemv": fk.fused_tiles(1), "dot": fk.fused_tiles(16)}  # one stream a program, and tl.dot tiles
# The whole-step cases check how the kernels compose (the ring write, the window, the residual stream), not the tiles
# (the cases above run the tables' own): wider gemv tiles, so the interpreter runs a fraction of the programs.
WIDE = ((fk.GEMV_MAX_BATCH, replace(TILES["gemv"], block_n_hidden=32, block_n_inter=32, block_n_vocab=128,
                                    pairs=16)),) + fk.FUSED_TILES[1:]


def head_case(model_type: str, tiles: str) -> dict:
    """_qkv_rope_kernel against layer_head + the ring write: from the embedding (layer 0) and from h (layer 1), at
    positions before the sinks, inside the window, and past a wrapped ring with a window below the ring."""
    model = tiny(model_type)
    w = ds.PackedDecoder.from_hf(model, sinks=2, window_max=8)
    s, t = w.shape, w.t
    ids, pos, window = torch.tensor([5, 77, 150]), torch.tensor([1, 6, 23]), 5
    keys, values = w.new_cache(4)  # one stream more than the batch: its rows stay untouched
    h0 = F.embedding(ids, t["embed"])
    h1 = torch.randn_like(h0)
    cos, sin = ds._angles(torch, w.inv_freq, pos, w.rope_scaling, w.dtype)
    cos_s, sin_s = ds._angles(torch, w.inv_freq, pos.clamp(max=s.sinks + window), w.rope_scaling, w.dtype)
    rows = torch.where(pos < s.sinks, pos, s.sinks + (pos - s.sinks) % s.window_max)
    out = {}
    for layer, x, from_ids, h_ref in ((0, t["embed"], True, h0), (1, h1, False, h1)):
        q_ref, qs_ref, k_ref, v_ref = ds.layer_head(h_ref, t["ln1"][layer], t["wqkv"][layer], t["bqkv"][layer],
                                                    t["qn"][layer], t["kn"][layer], cos, sin, cos_s, sin_s, shape=s)
        q, q_s = torch.empty_like(q_ref), torch.empty_like(q_ref)
        h = torch.zeros_like(h0)
        fk.qkv_rope(x, ids, h, t["ln1"][layer], t["wqkv"][layer], t["bqkv"][layer], t["qn"][layer], t["kn"][layer],
                    w.inv_freq.contiguous(), pos, torch.tensor(window), q, q_s, keys[layer], values[layer],
                    heads=s.heads, kv_heads=s.kv_heads, sinks=s.sinks, eps=s.eps, rope_scale=w.rope_scaling,
                    tiles=TILES[tiles], from_ids=from_ids)
        streams = torch.arange(3)
        name = f"head:{model_type}:{tiles}:layer{layer}"
        out[f"{name}:q"] = rel(q, q_ref)
        out[f"{name}:q_sink"] = rel(q_s, qs_ref)
        out[f"{name}:k_row"] = rel(keys[layer][streams, :, rows], k_ref)
        out[f"{name}:v_row"] = rel(values[layer][streams, :, rows], v_ref)
        written = torch.zeros(keys[layer].shape[:3], dtype=torch.bool)
        written[streams, :, rows] = True
        untouched = keys[layer][~written].abs().max() + values[layer][~written].abs().max()
        out[f"{name}:other_rows_untouched"] = float(untouched)
        if from_ids:
            out[f"{name}:h_from_ids"] = rel(h, h0)
    return out


def tail_case(model_type: str, tiles: str) -> dict:
    """The output projection + residual, norm + gate/up + SiLU, down + residual against layer_tail; the LM head's
    logits and its argmax against the eager ones."""
    model = tiny(model_type)
    w = ds.PackedDecoder.from_hf(model, sinks=2, window_max=8)
    s, t = w.shape, w.t
    torch.manual_seed(1)
    h, o = torch.randn(3, s.hidden), torch.randn(3, s.heads, s.head_dim)
    name, tiles = f"{model_type}:{tiles}", TILES[tiles]
    ref = ds.layer_tail(h, o, t["wo"][0], t["ln2"][0], t["wgu"][0], t["wd"][0], shape=s)
    got, act = h.clone(), torch.empty(3, s.intermediate)
    fk.linear_residual(o.view(3, -1), t["wo"][0], got, tiles=tiles)
    fk.gate_up(got, t["ln2"][0], t["wgu"][0], act, eps=s.eps, tiles=tiles)
    fk.linear_residual(act, t["wd"][0], got, tiles=tiles)
    logits_ref = F.linear(ds._rms_norm(torch, ref, t["norm"], s.eps), t["lm_head"])
    logits = fk.lm_head(ref, t["norm"], t["lm_head"], eps=s.eps, tiles=tiles, greedy=False)
    ids = fk.lm_head(ref, t["norm"], t["lm_head"], eps=s.eps, tiles=tiles, greedy=True)
    return {f"tail:{name}:h": rel(got, ref), f"lm_head:{name}:logits": rel(logits, logits_ref),
            f"lm_head:{name}:argmax_wrong": float((ids != logits_ref.argmax(-1)).sum())}


def step_case(model_type: str, steps: int = 9) -> dict:
    """decode_fused against decode_logits step by step: 2 staggered streams (one stream a program), 2 sinks, a ring
    of 4 rows that wraps, a window of 3 (below the ring); logits, greedy tokens and the caches."""
    model = tiny(model_type, seed=2)
    w = ds.PackedDecoder.from_hf(model, sinks=2, window_max=4)
    k1, v1 = w.new_cache(2)
    k2, v2 = w.new_cache(2)
    tokens = torch.randint(0, 200, (2, steps))
    worst, wrong = 0.0, 0
    for p in range(steps):
        pos = torch.tensor([p, max(p - 3, 0)])
        want = ds.decode_logits(w, tokens[:, p], pos, torch.tensor(3), k1, v1)
        got = ds.decode_fused(w, tokens[:, p], pos, torch.tensor(3), k2, v2)
        worst = max(worst, rel(got, want))
        wrong += int(not torch.equal(got.argmax(-1), want.argmax(-1)))
    cache = max(rel(a, b) for a, b in zip(k2 + v2, k1 + v1))
    return {f"step:{model_type}:logits": worst, f"step:{model_type}:argmax_wrong": float(wrong),
            f"step:{model_type}:cache": cache}


def greedy_graph_case(steps: int = 3) -> dict:
    """DecodeGraph(compile="fused") off CUDA runs the step eagerly: its greedy ids equal the eager step's; 5 streams
    (the tl.dot tiles), the last past the ring of 4 (2 sinks: its third step, at position 6, wraps)."""
    model = tiny("llama", seed=3)
    w = ds.PackedDecoder.from_hf(model, sinks=2, window_max=4)
    k1, v1 = w.new_cache(5)
    k2, v2 = w.new_cache(5)
    graph = ds.DecodeGraph(w, k2, v2, batch=5, compile="fused")
    wrong = 0
    for p in range(steps):
        ids, pos = torch.arange(5) * 11 + 3 * p, torch.arange(5) + p
        wrong += int(not torch.equal(graph(ids, pos, 0), ds.decode_greedy(w, ids, pos, torch.tensor(0), k1, v1)))
    return {"graph:greedy_wrong": float(wrong)}


def main() -> None:
    out = {}
    with torch.no_grad():
        for tiles in TILES:
            for kind in ("llama", "qwen2", "qwen3"):
                out.update(head_case(kind, tiles))
            out.update(tail_case("llama", tiles))
        with mock.patch.object(fk, "FUSED_TILES", WIDE):
            out.update(step_case("qwen3"))
            out.update(greedy_graph_case())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
