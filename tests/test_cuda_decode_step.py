"""The GPU decode step (runtime/cuda/decode_step.py) against Hugging Face, on the CPU (the ring op's reference
path) and, marked gpu, on CUDA with the Triton kernel, compiled and captured in a CUDA graph."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from edgeattn.runtime.cuda.decode_step import DecodeGraph, PackedDecoder, decode_logits  # noqa: E402


def tiny(model_type="llama", seed=0):
    torch.manual_seed(seed)
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, eos_token_id=None)
    if model_type == "qwen3":
        config = transformers.Qwen3Config(head_dim=16, **common)
        model = transformers.Qwen3ForCausalLM(config)
    elif model_type == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    return model.eval()


def run_tokens(weights, tokens, window, keys, values):
    out = []
    with torch.no_grad():
        for p, tok in enumerate(tokens):
            out.append(decode_logits(weights, torch.tensor([tok]), torch.tensor([p]), torch.tensor(window), keys,
                                     values)[0])
    return torch.stack(out)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_steps_equal_the_full_forward_while_the_stream_fits(model_type):
    model = tiny(model_type)
    weights = PackedDecoder.from_hf(model, sinks=4, window_max=32)
    keys, values = weights.new_cache(1)
    tokens = torch.randint(0, 96, (20,)).tolist()
    ours = run_tokens(weights, tokens, 0, keys, values)
    with torch.no_grad():
        ref = model(torch.tensor([tokens])).logits[0]
    err = float((ours - ref).abs().max() / ref.abs().max())
    assert err < 1e-4, err


def test_a_window_changes_the_answer_and_the_sinks_are_kept():
    """Past the window the step reads the sinks and the last W rows only: equal to Hugging Face on exactly those
    tokens would need StreamingLLM's positions, so compare with the ring reference op over the same cache."""
    model = tiny()
    weights = PackedDecoder.from_hf(model, sinks=2, window_max=8)
    tokens = torch.randint(0, 96, (30,)).tolist()  # wraps the ring of 8 three times
    k1, v1 = weights.new_cache(1)
    full = run_tokens(weights, tokens, 0, k1, v1)
    k2, v2 = weights.new_cache(1)
    small = run_tokens(weights, tokens, 4, k2, v2)
    assert torch.allclose(full[:6], small[:6], atol=1e-5)  # t < sinks + W: the same attention
    assert not torch.allclose(full[-1], small[-1], atol=1e-3)
    assert torch.isfinite(small).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["none", "layers", "linked", "whole"])
def test_graph_replays_equal_eager_steps_on_cuda(mode):
    model = tiny().to("cuda")
    weights = PackedDecoder.from_hf(model, sinks=4, window_max=64)
    tokens = torch.randint(0, 96, (3, 40), device="cuda")
    k1, v1 = weights.new_cache(3)
    k2, v2 = weights.new_cache(3)
    graph = DecodeGraph(weights, k2, v2, batch=3, splits=1, compile=mode)
    for p in range(40):
        pos = torch.full((3,), p, device="cuda")
        want = decode_logits(weights, tokens[:, p], pos, torch.tensor(16, device="cuda"), k1, v1).argmax(-1)
        got = graph(tokens[:, p], pos, 16)
        assert torch.equal(want, got)
    assert torch.allclose(k1[0].float(), k2[0].float(), atol=1e-5)


def test_the_linked_pieces_compute_the_same_step():
    """decode_linked (cache writes inside the pieces, attention reading rows already written) equals
    decode_logits (the ring op writes, then attends), through a wrapping ring at a small window."""
    from edgeattn.runtime.cuda.decode_step import decode_linked

    model = tiny("qwen3")
    weights = PackedDecoder.from_hf(model, sinks=2, window_max=8)
    tokens = torch.randint(0, 96, (2, 20))
    k1, v1 = weights.new_cache(2)
    k2, v2 = weights.new_cache(2)
    with torch.no_grad():
        for p in range(20):
            pos = torch.tensor([p, max(p - 3, 0)])
            a = decode_logits(weights, tokens[:, p], pos, torch.tensor(5), k1, v1)
            b = decode_linked(weights, tokens[:, p], pos, torch.tensor(5), k2, v2)
            assert torch.allclose(a, b, atol=1e-5), p
    assert torch.equal(k1[1], k2[1])
