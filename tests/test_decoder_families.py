"""Decoder export across rotary causal LM families: tiny random models of each (built from configs in code),
the exported decoder's greedy tokens through a cpu bundle against Hugging Face `generate`, and the reasons
given for models the export cannot take."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgeattn.attention import DOMAIN
from edgeattn.attention.cached_function import CACHED_INPUTS, cached_function_proto, make_cached_node
from edgeattn.attention.cached_reference import cached_attention_np, write_ring
from onnx_fixtures import has

requires_hf = pytest.mark.skipif(not (has("torch") and has("transformers") and has("tokenizers")),
                                 reason="needs torch, transformers and tokenizers")

VOCAB, BOS, EOS = 1024, 256, 257  # above the build's sample token ids (< 1000)
LOCAL = 8  # the sliding window of the tiny models' local layers: shorter than the greedy test's context
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3")


def _config(family: str):
    import transformers as t

    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, bos_token_id=BOS, eos_token_id=EOS,
                pad_token_id=EOS, tie_word_embeddings=False)
    one_kv = {**base, "num_key_value_heads": 1}
    return {
        "llama": lambda: (t.LlamaForCausalLM, t.LlamaConfig(**base)),
        "mistral": lambda: (t.MistralForCausalLM, t.MistralConfig(**base, sliding_window=16)),  # every layer
        "qwen2": lambda: (t.Qwen2ForCausalLM, t.Qwen2Config(**base)),  # q/k/v biases
        "qwen3": lambda: (t.Qwen3ForCausalLM, t.Qwen3Config(**base, head_dim=16)),  # q/k norms
        "gemma": lambda: (t.GemmaForCausalLM, t.GemmaConfig(**base, head_dim=16)),
        "gemma2": lambda: (t.Gemma2ForCausalLM, t.Gemma2Config(
            **one_kv, head_dim=32, query_pre_attn_scalar=24, sliding_window=LOCAL, attn_logit_softcapping=0.1,
            final_logit_softcapping=30.0)),
        "gemma3": lambda: (t.Gemma3ForCausalLM, t.Gemma3TextConfig(
            **one_kv, head_dim=32, query_pre_attn_scalar=24, sliding_window=LOCAL,
            layer_types=["sliding_attention", "full_attention"])),  # local base 10,000, global 1,000,000
        "phi3": lambda: (t.Phi3ForCausalLM, t.Phi3Config(**base, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),  # fused qkv, gate_up
    }[family]()


def tiny_model(family: str, seed: int = 0):
    """A random model of `family`: biases and norm weights drawn (not their zero / one init), so the
    families' differences show in the logits, and an LM head large enough that greedy choices are no ties."""
    import torch

    cls, config = _config(family)
    config._attn_implementation = "eager"  # Gemma 2's soft-capping lives in the eager path
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(0.0 if name.endswith("bias") or family.startswith("gemma") else 1.0, 0.3)
        model.lm_head.weight.mul_(8.0)
    return model


def byte_tokenizer():
    """A fast byte-level tokenizer of VOCAB ids (256 bytes, <bos>, <eos>, then unused ids)."""
    import tokenizers
    import transformers
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({"<bos>": BOS, "<eos>": EOS, **{f"<x{i}>": i for i in range(EOS + 1, VOCAB)}})
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<bos>", "<eos>"])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>")


def _eager_stream(model, ids, chunks, sinks=4, window_max=48):
    """Logits of the export's PyTorch module over `ids`, prefilled in `chunks`, with its own ring writes."""
    import torch

    from edgeattn.attention.cached_torch import write_ring_
    from edgeattn.decoder.cached_llama import CachedDecoder
    from edgeattn.decoder.export import DecoderExportConfig, effective_config

    config = effective_config(model.config, DecoderExportConfig(sinks=sinks, window_max=window_max))
    dec = CachedDecoder(model, config.sinks).eval()
    cap = config.sinks + config.window_max
    past = [torch.zeros(1, dec.kv_heads, cap, dec.head_dim) for _ in range(2 * len(dec.layers))]
    out = []
    with torch.no_grad():
        for a, b in chunks:
            pos = torch.tensor([a])
            logits, *presents = dec(torch.tensor([ids[a:b]]), pos, torch.tensor(0), *past)
            for i in range(len(dec.layers)):
                write_ring_(past[2 * i], past[2 * i + 1], presents[2 * i], presents[2 * i + 1], pos, config.sinks)
            out.append(logits[0])
    return torch.cat(out).numpy()


@requires_hf
@pytest.mark.parametrize("family", FAMILIES)
def test_the_export_module_matches_hugging_face_chunk_by_chunk(family):
    """Every family's differences (biases, norms, soft-capping, partial rotary, per-layer windows) are in the
    module the export traces: its logits over a 30-token stream (past the local windows) equal the model's."""
    import torch

    model = tiny_model(family)
    ids = list(range(100, 130))
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].numpy()
    got = _eager_stream(model, ids, ((0, 7), (7, 8), (8, 20), (20, 30)))
    assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max())


@requires_hf
def test_gemma3_local_layers_keep_their_window():
    """Past LOCAL tokens a Gemma 3 local layer reads only its trained window, whatever the run-time window."""
    from edgeattn.decoder import families

    model = tiny_model("gemma3")
    assert families.layer_windows(model.config) == (LOCAL, None)
    ids = list(range(100, 130))
    capped = _eager_stream(model, ids, ((0, 30),))
    model.config.sliding_window = 64  # the same model with a local window longer than the stream
    wide = _eager_stream(model, ids, ((0, 30),))
    assert np.abs(wide - capped)[:LOCAL].max() < 1e-5 and np.abs(wide - capped)[LOCAL:].max() > 1e-2


@requires_hf
def test_a_multimodal_gemma3_exports_its_language_model():
    """Gemma 3 4B and up are Gemma3ForConditionalGeneration: the export takes the language model inside."""
    import torch
    import transformers as t

    from edgeattn.hf_models import kind_of

    text = _config("gemma3")[1].to_dict()
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = t.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=1000,
                            boi_token_index=1001, eoi_token_index=1002)
    config._attn_implementation = config.text_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = t.Gemma3ForConditionalGeneration(config).eval()
    assert kind_of(config) == "decoder"
    ids = list(range(100, 130))
    with torch.no_grad():
        want = model(input_ids=torch.tensor([ids])).logits[0].numpy()
    got = _eager_stream(model, ids, ((0, 7), (7, 8), (8, 20), (20, 30)))
    assert np.abs(got - want).max() < 1e-4 * max(1.0, np.abs(want).max())


@requires_hf
def test_gemma2_soft_capping_changes_the_logits():
    import torch

    model = tiny_model("gemma2")
    ids = list(range(100, 120))
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].numpy()
    model.config.attn_logit_softcapping = None
    assert np.abs(_eager_stream(model, ids, ((0, 20),)) - want).max() > 1e-2  # so the equality above means it


def _hf_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=EOS)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@requires_hf
@pytest.mark.slow  # the dynamo export of even a 2-layer model takes 30-90 s on the 2-core machine
@pytest.mark.parametrize("family", [f if f in ("qwen3", "gemma3") else pytest.param(f, marks=pytest.mark.long)
                                    for f in FAMILIES])  # two in the default run, every family with -m long
def test_greedy_tokens_equal_hugging_face_generate(family, tokenizer, tmp_path):
    """The exported decoder, built for cpu (with its fast path where it applies) and run by the generation API,
    gives Hugging Face's greedy tokens; the prompt and the new tokens (37) run past the local windows."""
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder import families
    from edgeattn.decoder.export import DecoderExportConfig, effective_config, export_decoder_model
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    model = tiny_model(family)
    config = DecoderExportConfig(sinks=4, window_max=48)
    geometry = effective_config(model.config, config)
    path = export_decoder_model(model, tokenizer, tmp_path / f"{family}.onnx", config)
    ring = 48  # the runtime's ring holds the whole context (Mistral's trained window, 16, is shorter: it holds)
    cap = geometry.sinks + ring
    bundle = build(path, BuildConfig(target="cpu", seq=(1, 1, 16), dims=(("cache", (16, cap, cap)),)))
    ids = tokenizer("The window shrinks as it", add_special_tokens=False).input_ids
    want = _hf_greedy(model, ids, 16)
    with Generator.open(bundle.path, window_max=ring) as gen:
        got = gen.generate(ids, GenerationConfig(max_tokens=16, prefill_chunk=5))  # window 0: the whole ring
    want = want[:want.index(EOS)] if EOS in want else want
    assert got.tokens == want
    assert len(ids) + len(want) > LOCAL
    decoder = bundle.manifest.sections["decoder"]
    assert decoder["layer_windows"] == list(families.layer_windows(model.config))
    if any(decoder["layer_windows"]):  # min(W, trained) is computed in the graph: the fast path cannot honour it
        assert "fast_path_model" not in decoder and decoder["sinks"] == 0


@requires_hf
@pytest.mark.slow  # one dynamo export
def test_the_cli_exports_a_folder_and_shows_its_stages(tokenizer, tmp_path):
    from click.testing import CliRunner

    from edgeattn.cli.main import cli

    tiny_model("gemma3").save_pretrained(tmp_path / "gemma3")
    tokenizer.save_pretrained(tmp_path / "gemma3")
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "gemma3"), "--decoder", "--out",
                                      str(tmp_path / "g.onnx")])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()  # not a terminal: a line a stage (transformers may add its own)
    stages = [lines.index(s) for s in ("loading", "tracing and exporting (about 40 s)", "saving")]
    assert stages == sorted(stages)
    assert (tmp_path / "g.onnx").is_file()


# -- models the export cannot take: the true reason ------------------------------------------------------------

@requires_hf
def test_reasons_for_models_the_export_cannot_take():
    import transformers as t

    from edgeattn.decoder.families import why_not
    from edgeattn.hf_models import kind_of

    bert = t.BertConfig(architectures=["BertModel"])
    assert why_not(bert) == "expected a causal LM, found an encoder (BertModel)"
    assert "no rotary attention" in why_not(t.GPT2Config(architectures=["GPT2LMHeadModel"]))
    chunked = t.Qwen2Config(num_hidden_layers=2, layer_types=["full_attention", "chunked_attention"])
    assert why_not(chunked) == ("qwen2: unsupported attention type 'chunked_attention' (the export handles "
                                "full_attention, sliding_attention)")
    assert "bidirectional" in why_not(t.Gemma3TextConfig(use_bidirectional_attention=True))
    longrope = t.Phi3Config(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 48,
                                              "long_factor": [1.0] * 48, "original_max_position_embeddings": 2048},
                            max_position_embeddings=4096)
    assert "rope_type 'longrope'" in why_not(longrope)
    gemma3 = t.Gemma3Config()  # the multimodal checkpoints (4B and up): a causal LM inside
    assert kind_of(gemma3) == "decoder" and why_not(gemma3) is None


@requires_hf
def test_the_cli_gives_the_reason(tmp_path):
    import transformers as t
    from click.testing import CliRunner

    from edgeattn.cli.main import cli

    config = t.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=32, architectures=["BertModel"])
    t.BertModel(config).save_pretrained(tmp_path / "bert")
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "bert"), "--decoder", "--quiet", "--out",
                                      str(tmp_path / "x.onnx")])
    assert result.exit_code != 0
    assert "expected a causal LM, found an encoder (BertModel)" in result.output


# -- soft-capping in the op's ONNX body and its reference --------------------------------------------------------

def _session(sinks: int, softcap: float) -> ort.InferenceSession:
    return ort.InferenceSession(_session_model(sinks, softcap).SerializeToString(), providers=["CPUExecutionProvider"])


def _session_model(sinks: int, softcap: float) -> onnx.ModelProto:
    """One cached op on 4 query heads, 2 KV heads, head size 8."""
    f, i = TensorProto.FLOAT, TensorProto.INT64
    shapes = {"q": ["b", 4, "s", 8], "q_sink": ["b", 4, "s", 8], "k": ["b", 2, "s", 8], "v": ["b", 2, "s", 8],
              "past_key": ["b", 2, "c", 8], "past_value": ["b", 2, "c", 8]}
    ins = [helper.make_tensor_value_info(n, f, shapes[n]) for n in CACHED_INPUTS[:6]]
    ins += [helper.make_tensor_value_info("cache_position", i, ["b"]), helper.make_tensor_value_info("window", i, [])]
    node = make_cached_node(list(CACHED_INPUTS), out="out", sinks=sinks, softcap=softcap)
    graph = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("out", f, ["b", 4, "s", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, 1)])
    model.functions.append(cached_function_proto(18))
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("softcap", [0.0, 0.7])
def test_soft_capped_body_matches_the_reference(softcap):
    rng = np.random.default_rng(5)
    sinks, wmax, d = 2, 6, 8
    sess = _session(sinks, softcap)
    pk, pv = np.zeros((1, 2, sinks + wmax, d), np.float32), np.zeros((1, 2, sinks + wmax, d), np.float32)
    n = 0
    for s in (3, 1, 4, 1, 2):
        feeds = {x: rng.standard_normal((1, 4 if x.startswith("q") else 2, s, d)).astype(np.float32) * 2
                 for x in ("q", "q_sink", "k", "v")}
        feeds.update(past_key=pk, past_value=pv, cache_position=np.array([n]), window=np.array(0, np.int64))
        got = sess.run(None, feeds)[0]
        want = cached_attention_np(*(feeds[x] for x in CACHED_INPUTS[:6]), feeds["cache_position"], 0, sinks=sinks,
                                   softcap=softcap)
        np.testing.assert_allclose(got, want, atol=1e-5)
        if softcap:
            plain = cached_attention_np(*(feeds[x] for x in CACHED_INPUTS[:6]), feeds["cache_position"], 0, sinks=sinks)
            assert np.abs(plain - want).max() > 1e-2
        write_ring(pk, pv, feeds["k"], feeds["v"], feeds["cache_position"], sinks)
        n += s


def test_soft_capped_layers_keep_the_body_where_the_plugin_and_the_cpu_lowering_would_drop_the_cap():
    import onnx_ir as ir

    from edgeattn.engines.tensorrt.attention_mapping import map_attention
    from edgeattn.passes.cached_attention_cpu import lower_cached

    for softcap, to in ((0.0, "plugin"), (0.7, "body")):
        model = ir.serde.deserialize_model(_session_model(2, softcap))
        assert [r["to"] for r in map_attention(model, use_plugin=True)] == [to]
        lowered, _, kept, _ = lower_cached(ir.serde.deserialize_model(_session_model(2, softcap)))
        assert (lowered, len(kept)) == ((1, 0) if not softcap else (0, 1))
