"""Generation from decoder bundles on ONNX Runtime (the embedded default), against Hugging Face `generate`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from decoder_fixtures import SINKS, WINDOW_MAX, requires_decoder_stack
from edgeattn.cli.main import cli
from edgeattn.errors import BundleError, ConfigError, InputError

pytestmark = requires_decoder_stack


def _hf_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                         pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_bundle_is_a_decoder_with_its_tokenizer(tiny_decoder):
    from edgeattn.bundle.folder import open_bundle

    _, _, _, path = tiny_decoder
    m = open_bundle(path).manifest
    assert m.sections["decoder"]["sinks"] == SINKS and m.sections["decoder"]["window_max"] == WINDOW_MAX
    assert {"tokenizer.json", "generation.json"} <= set(m.files)
    assert [i.name for i in m.inputs][:3] == ["input_ids", "cache_position", "attention_window"]
    assert "past_key_values.1.value" in [i.name for i in m.inputs] and "present.0.key" in [o.name for o in m.outputs]


def test_greedy_tokens_equal_hugging_face_generate(tiny_decoder):
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    model, tok, _, path = tiny_decoder
    ids = tok("The window shrinks as the device heats up, and", add_special_tokens=False).input_ids
    want = _hf_greedy(model, ids, 24)
    with Generator.open(path) as gen:
        got = gen.generate(ids, GenerationConfig(max_tokens=24, prefill_chunk=5))
    assert got.tokens[:len(want)] == want[:len(got.tokens)] and len(got.tokens) >= 1
    eos = set(gen.model.eos)
    assert got.finish_reason == ("stop" if len(got.tokens) < 24 else "length") or want[len(got.tokens)] in eos


def test_logits_match_hugging_face_chunk_by_chunk(tiny_decoder):
    import torch

    from edgeattn.runtime.generation.generator import Generator

    model, tok, _, path = tiny_decoder
    ids = list(range(100, 140))  # 40 tokens: inside the cache (4 + 48), so exact full attention
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].numpy()
    with Generator.open(path) as gen:
        cache = gen.model.new_cache(1)
        got = [gen.model.step(cache, [0], np.array([ids[a:b]]), 0)[0] for a, b in ((0, 7), (7, 8), (8, 29), (29, 40))]
    assert np.abs(np.concatenate(got) - want).max() < 1e-3


class _ChunkRecorder:
    """A DecoderBackend recording (position, chunk length, window) per step."""

    codec, eos, vocab_size = None, frozenset(), 3

    def __init__(self, sinks: int, window_max: int) -> None:
        from edgeattn.attention.ring import RingLayout

        self.layout, self.calls = RingLayout(sinks, window_max), []

    def activate(self):
        return self

    def deactivate(self) -> None:
        pass

    def new_cache(self, streams: int = 1):
        from edgeattn.runtime.generation.cache import KVCache

        return KVCache(layers=1, kv_heads=1, head_dim=1, layout=self.layout, streams=streams)

    def check_window(self, window: int) -> int:
        return window

    def step(self, cache, streams, ids, window, last_only=False):
        self.calls.append((int(cache.positions[streams[0]]), ids.shape[1], window))
        cache.positions[streams[0]] += ids.shape[1]
        return np.zeros((1, 1 if last_only else ids.shape[1], 3), np.float32)


@pytest.mark.parametrize("window, first", [(6, 10), (0, 32), (40, 32)])
def test_prefill_ends_a_chunk_holding_sinks_by_sinks_plus_window(window, first):
    """The op scores a chunk's own keys with q (true distances), the sink rows with q rotated at min(t, sinks + W):
    a first chunk reaching past sinks + W would read the sinks farther away than token-by-token prefill does."""
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    model = _ChunkRecorder(SINKS, WINDOW_MAX)
    result = Generator(model).generate(list(range(50)), GenerationConfig(prefill_chunk=32, max_tokens=1,
                                                                         window=window))
    assert [c[:2] for c in model.calls][:2] == [(0, first), (first, min(32, 50 - first))]
    assert sum(c[1] for c in model.calls) == 50 and {c[2] for c in model.calls} == {window}
    assert result.tokens == [0] and result.finish_reason == "length"


def test_window_shrinks_and_grows_back_without_losing_rows(tiny_decoder):
    """Shrinking reads fewer ring rows and drops none; growing back reads them all again."""
    import copy

    from edgeattn.runtime.generation.generator import Generator

    _, _, _, path = tiny_decoder
    ids = np.arange(200, 240)[None]
    with Generator.open(path) as gen:
        a, b = gen.model.new_cache(1), gen.model.new_cache(1)
        gen.model.step(a, [0], ids, 0)
        gen.model.step(b, [0], ids, 0)
        narrow = gen.model.step(a, [0], np.array([[7]]), 8)  # shrink to 8 for one step
        full = gen.model.step(b, [0], np.array([[7]]), 0)
        assert np.abs(narrow - full).max() > 1e-3  # the window changed the result
        rows = a.layout.slots(np.arange(40))  # the 40 prompt tokens' rows: untouched by the narrow step
        for x, y in zip(a.keys + a.values, b.keys + b.values):
            np.testing.assert_array_equal(x[:, :, rows], y[:, :, rows])
        forgotten = copy.deepcopy(a)  # what a cache that dropped the rows outside the window would hold
        for x in forgotten.keys + forgotten.values:
            x[:, :, a.layout.slots(np.arange(a.layout.sinks, 32))] = 0.0
        grown = gen.model.step(a, [0], np.array([[9]]), 0)  # grow back
        dropped = gen.model.step(forgotten, [0], np.array([[9]]), 0)
        assert np.abs(grown - dropped).max() > 1e-3  # the old rows are read again


def test_a_long_prompt_keeps_head_and_tail_and_says_what_was_evicted(tiny_decoder):
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    _, _, _, path = tiny_decoder
    with Generator.open(path) as gen:
        result = gen.generate(list(range(300, 420)), GenerationConfig(max_tokens=4))  # 120 tokens > 52 rows
    assert result.prompt_tokens == 120 and result.evicted_prompt_tokens == 120 - (SINKS + WINDOW_MAX - 4)
    assert 1 <= result.completion_tokens <= 4


def test_sampling_is_reproducible_with_a_seed(tiny_decoder):
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator
    from edgeattn.runtime.generation.sampling import SamplingConfig

    _, _, _, path = tiny_decoder
    cfg = GenerationConfig(max_tokens=12, sampling=SamplingConfig(temperature=1.3, top_p=0.95, top_k=50, seed=7))
    other = GenerationConfig(max_tokens=12, sampling=SamplingConfig(temperature=1.3, top_p=0.95, top_k=50, seed=8))
    with Generator.open(path) as gen:
        a, b, c = (gen.generate("Once upon a time", x).tokens for x in (cfg, cfg, other))
    assert a == b and a != c


def test_streamed_text_is_valid_utf8_and_joins_to_the_whole(tiny_decoder):
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator
    from edgeattn.runtime.generation.sampling import SamplingConfig

    _, tok, _, path = tiny_decoder
    cfg = GenerationConfig(max_tokens=40, sampling=SamplingConfig(temperature=2.0, seed=3))
    with Generator.open(path) as gen:
        pieces = [c.text for c in gen.stream("Héllo wörld ✓ 日本語", cfg)]
        result = gen.generate("Héllo wörld ✓ 日本語", cfg)
    for p in pieces:
        p.encode("utf-8")  # no lone surrogates
        assert "\ufffd" not in p or p is pieces[-1]
    assert "".join(pieces) == result.text == tok.decode(result.tokens, skip_special_tokens=True)


def test_stop_strings_end_the_text(tiny_decoder):
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    _, tok, _, path = tiny_decoder
    with Generator.open(path) as gen:
        full = gen.generate("A B C", GenerationConfig(max_tokens=20)).text
        assert len(full) > 4
        stop = full[2:4]
        cut = gen.generate("A B C", GenerationConfig(max_tokens=20, stop=(stop,)))
    assert cut.text == full[:full.find(stop)] and cut.finish_reason == "stop"


def test_chat_template_is_applied(tiny_decoder):
    from edgeattn.runtime.generation.generator import Generator

    _, tok, _, path = tiny_decoder
    messages = [{"role": "user", "content": "What is a ring buffer?"}]
    want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    with Generator.open(path) as gen:
        assert gen.model.codec.render_chat(messages) == want
        assert gen.prompt_ids(messages) == tok(want, add_special_tokens=False).input_ids


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
])
def test_sampling_values_out_of_range(kwargs, message):
    from edgeattn.runtime.generation.sampling import SamplingConfig

    with pytest.raises(ConfigError, match=message):
        SamplingConfig(**kwargs)


def test_bad_input_is_a_clear_error(tiny_decoder, tiny_onnx, tmp_path, runner):
    import shutil

    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    _, _, _, path = tiny_decoder
    with pytest.raises(ConfigError, match="max_tokens"):
        GenerationConfig(max_tokens=0)
    with Generator.open(path) as gen:
        with pytest.raises(ConfigError, match=f"0 \\(the whole ring\\) to {WINDOW_MAX}"):
            gen.generate("hi", GenerationConfig(max_tokens=2, window=WINDOW_MAX + 1))
        wrong = Generator.open(path, window_max=16).model.new_cache(1)
        with pytest.raises(ConfigError, match="cache: expected"):
            gen.model.check_cache(wrong)
    encoder = build(tiny_onnx, BuildConfig(target="cpu"))
    with pytest.raises(BundleError, match="expected a decoder bundle"):
        Generator.open(encoder.path)
    result = runner.invoke(cli, ["generate", str(encoder.path), "--prompt", "hi"])
    assert result.exit_code == 3 and "expected a decoder bundle" in result.output
    no_tok = tmp_path / "no_tok.edgeattn"
    shutil.copytree(path, no_tok)
    (no_tok / "tokenizer.json").unlink()
    with pytest.raises(BundleError, match="tokenizer.json"):
        Generator.open(no_tok)
    result = runner.invoke(cli, ["generate", str(path), "--prompt", "hi", "--temperature", "-1"])
    assert result.exit_code == 2 and "temperature" in result.output
    with pytest.raises(InputError, match="empty prompt"):
        with Generator.open(path) as gen:
            gen.generate("", GenerationConfig(max_tokens=2))
    with Generator.open(path) as gen:
        model, cache = gen.model, gen.model.new_cache(1)
        for ids, found in (([[model.vocab_size]], f"{model.vocab_size}..{model.vocab_size}"), ([[3, -1, 5]], "-1..5")):
            with pytest.raises(InputError, match=f"expected 0 to {model.vocab_size - 1}, found {found}"):
                model.step(cache, [0], np.array(ids), 0)
        with pytest.raises(InputError, match="streams: expected at least one"):
            model.step(cache, [], np.zeros((0, 1), np.int64), 0)
        assert cache.positions.tolist() == [0]  # nothing ran


def test_cli_generates_and_streams(tiny_decoder, runner):
    _, _, _, path = tiny_decoder
    result = runner.invoke(cli, ["generate", str(path), "--prompt", "Edge devices", "--max-tokens", "8", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["usage"]["completion_tokens"] == len(data["tokens"]) <= 8
    streamed = runner.invoke(cli, ["generate", str(path), "--prompt", "Edge devices", "--max-tokens", "8", "--stream"])
    assert streamed.exit_code == 0 and data["text"] in streamed.stdout


def test_a_trained_sliding_window_is_kept(tmp_path):
    """A Mistral-style model (sliding_window 16): the export takes that ring and no sinks, and a 40-token
    stream through the bundle gives Hugging Face's logits, the window included."""
    import torch
    import transformers

    from decoder_fixtures import tiny_llama
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder.export import DecoderExportConfig, export_decoder_model
    from edgeattn.runtime.generation.generator import Generator

    _, tok = tiny_llama()
    config = transformers.MistralConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, sliding_window=16,
                                        max_position_embeddings=256, attn_implementation="eager")
    torch.manual_seed(1)
    model = transformers.MistralForCausalLM(config).eval()
    onnx_path = export_decoder_model(model, tok, tmp_path / "mistral.onnx", DecoderExportConfig(sinks=4))
    bundle = build(onnx_path, BuildConfig(target="cpu", seq=(1, 1, 16), dims=(("cache", (8, 16, 16)),)))
    assert bundle.manifest.sections["decoder"]["window_max"] == 16 and bundle.manifest.sections["decoder"]["sinks"] == 0
    ids = list(range(500, 540))
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].numpy()
    with Generator.open(bundle.path) as gen:
        cache = gen.model.new_cache(1)
        got = [gen.model.step(cache, [0], np.array([ids[a:b]]), 0)[0] for a, b in ((0, 10), (10, 26), (26, 40))]
    assert np.abs(np.concatenate(got) - want).max() < 1e-3


def test_every_backend_checks_the_window_through_the_ring_layout():
    """One rule for a window a caller asks for (attention/ring.py), whichever backend is asked."""
    from edgeattn.attention.ring import RingLayout
    from edgeattn.errors import ConfigError

    layout = RingLayout(4, 16)
    assert layout.check_window(0) == 0 and layout.check_window(np.int64(16)) == 16
    for bad in (-1, 17, True, 2.0, "8"):
        with pytest.raises(ConfigError, match="window: expected"):
            layout.check_window(bad)
