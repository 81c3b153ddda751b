"""The decode engine on CUDA: `TorchDecoderModel` (the cache on the GPU, decode steps replayed as CUDA graphs)
is a DecoderBackend like a bundle's, so the Generator and the server's scheduler drive it unchanged and give the
same tokens (with slots moved and swapped in the GPU cache)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from onnx_fixtures import has

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (has("torch") and has("transformers")),
                                                  reason="needs torch and transformers")]


def _cuda_model():
    import torch
    import transformers

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      bos_token_id=1, eos_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger logits, so greedy choices are not near-ties
        model.lm_head.weight.mul_(8.0)
    return model.to("cuda")


@pytest.mark.parametrize("window", [0, 8])
def test_fp32_ring_decode_kernel_multiplies_in_fp32(window):
    """The Triton ring decode on fp32 operands against the op in float64: within 1e-5. Tensor-core products
    round fp32 to tf32 (errors ~1e-3 here), enough to flip a greedy token between a batched step (the kernel) and
    a stream's step alone (PyTorch's fp32 products), which made the scheduler test below fail now and then."""
    import torch

    from edgeattn.attention.cached_torch import cached_windowed_attention, write_ring_
    from edgeattn.plugins.kernels.cached_decode import cached_decode

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(1)
    b, h, h_kv, d, c, sinks = 3, 4, 2, 64, 40, 4
    q, qs = torch.randn(b, h, 1, d, dtype=torch.float64), torch.randn(b, h, 1, d, dtype=torch.float64)
    k, v = torch.randn(b, h_kv, 1, d, dtype=torch.float64), torch.randn(b, h_kv, 1, d, dtype=torch.float64)
    kc, vc = torch.randn(b, h_kv, c, d, dtype=torch.float64), torch.randn(b, h_kv, c, d, dtype=torch.float64)
    pos, w = torch.tensor([5, 30, 70]), torch.tensor(window)  # 70: past the ring's 36 rows, wrapped
    want = cached_windowed_attention(q, qs, k, v, kc, vc, pos, w, sinks=sinks)
    kg, vg = kc.float().cuda(), vc.float().cuda()
    write_ring_(kg, vg, k.float().cuda(), v.float().cuda(), pos.cuda(), sinks)
    got = cached_decode(q.float().cuda(), qs.float().cuda(), kg, vg, pos.cuda(), w.cuda(), sinks=sinks)
    err = float((got.double().cpu() - want).abs().max())
    assert err < 1e-5, err


def test_decode_graphs_belong_to_their_cache():
    """Caches made and dropped one after another (as the generator does, one per request) each get their own
    captured steps: a new cache that takes a dropped one's id must not replay a graph over the dropped buffers.
    Every step equals the eager one's logits, and the graphs go with their cache."""
    import gc

    from edgeattn.runtime.generation.torch_decoder import TorchDecoderModel

    model = _cuda_model()
    graphs = TorchDecoderModel(model, None, sinks=4, window_max=32, eos_token_ids=(0,))
    eager = TorchDecoderModel(model, None, sinks=4, window_max=32, eos_token_ids=(0,), cuda_graphs=False)
    ids = [[[10 + 3 * i + j for j in range(6)]] for i in range(8)]
    for i in range(8):
        cache, ref = graphs.new_cache(1 + i % 3), eager.new_cache(1 + i % 3)
        a, b = graphs.step(cache, [0], ids[i], 0), eager.step(ref, [0], ids[i], 0)
        for _ in range(4):  # one token a step: captured, then replayed
            tok = [[int(a[0, -1].argmax())]]
            a, b = graphs.step(cache, [0], tok, 0), eager.step(ref, [0], tok, 0)
            assert np.allclose(a, b, atol=1e-4), i
        del cache, ref
        gc.collect()
    assert len(graphs._graphs) == 0


@pytest.mark.parametrize("window", [0, 8])
def test_scheduler_equals_generator_on_cuda(window):
    from edgeattn.runtime.generation.engine import new_job
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator
    from edgeattn.runtime.generation.sampling import SamplingConfig
    from edgeattn.runtime.generation.torch_decoder import TorchDecoderModel
    from edgeattn.runtime.server.scheduler import SlotScheduler

    backend = TorchDecoderModel(_cuda_model(), None, sinks=4, window_max=32, eos_token_ids=(0,))
    prompts = [list(range(10 + 7 * i, 10 + 7 * i + n)) for i, n in enumerate((5, 20, 3, 40, 11, 2))]
    limits = [30, 12, 45, 20, 6, 38]  # 40 + 20 > 36 rows: that stream wraps the ring
    refs = [Generator(backend).generate(p, GenerationConfig(max_tokens=m, window=window, prefill_chunk=8)).tokens
            for p, m in zip(prompts, limits)]
    done, lock = [], threading.Lock()

    def deliver(events):
        with lock:
            done.extend(job for job, event in events if event.finish_reason is not None)

    scheduler = SlotScheduler(backend, slots=3, max_queue=8, prefill_chunk=8, window=lambda: window,
                              deliver=deliver)
    jobs = [new_job(backend.layout, p, max_tokens=m, sampling=SamplingConfig()) for p, m in zip(prompts, limits)]
    scheduler.start()
    try:
        for job in jobs:
            scheduler.submit(job)
        deadline = time.monotonic() + 300
        while len(done) < len(jobs) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        scheduler.close()
    assert [j.finish_reason for j in jobs] == ["length" if len(r) == m else "stop" for r, m in zip(refs, limits)]
    assert [j.tokens for j in jobs] == refs and scheduler.moves > 0


def _prompts_together(backend, prompts, limits, window, chunk):
    """Jobs arriving together through one engine: (their tokens, the number of streams in each prefill call)."""
    from edgeattn.runtime.generation.engine import Engine, new_job
    from edgeattn.runtime.generation.sampling import SamplingConfig

    calls = []

    def counted(method):
        def call(cache, streams, chunks, *args):
            calls.append(len(chunks))
            return method(cache, streams, chunks, *args)
        return call

    backend.prefill, backend.prefill_sample = counted(backend.prefill), counted(backend.prefill_sample)
    engine = Engine(backend, slots=len(prompts), prefill_chunk=chunk, window=lambda: window,
                    deliver=lambda events: None)
    jobs = [new_job(backend.layout, p, max_tokens=m, sampling=SamplingConfig()) for p, m in zip(prompts, limits)]
    for job in jobs:
        engine.add(job)
    while not engine.idle():
        engine.step()
    return [j.tokens for j in jobs], calls


@pytest.mark.parametrize("window", [0, 8])
def test_batched_prefill_on_cuda_equals_one_stream_at_a_time(window):
    """fp32 on the GPU: ragged chunks of 4 streams in one call (first chunks, later chunks, chunks past the
    window) give the logits and cache rows of one stream a call; through the engine, prompts arriving together
    get each prompt's greedy tokens alone, in prefill calls of several streams."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    _check_batched_prefill(_cuda_model().float(), window)


def _check_batched_prefill(model, window):
    import numpy as np

    from edgeattn.runtime.cuda.backend import CudaDecoder
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    def make():
        return CudaDecoder.from_hf(model, sinks=4, window_max=48)

    dec = make()
    rng = np.random.default_rng(0)
    batched, alone = dec.new_cache(4), dec.new_cache(4)
    for round_ in ([(0, 10), (1, 3), (2, 30), (3, 1)], [(1, 5), (0, 6), (2, 4)], [(0, 5), (1, 30), (3, 2)]):
        streams = [s for s, _ in round_]
        chunks = [rng.integers(3, 512, n) for _, n in round_]
        got = dec.prefill(batched, streams, chunks, window)
        want = np.concatenate([dec.prefill(alone, [s], [c], window) for s, c in zip(streams, chunks)])
        np.testing.assert_allclose(got, want, atol=1e-3, rtol=0)
    assert np.array_equal(batched.positions, alone.positions)
    for a, b in zip(batched.keys, alone.keys):
        for s in range(4):
            held = min(int(batched.positions[s]), dec.layout.capacity)
            assert float((a[s, :, :held] - b[s, :, :held]).abs().max()) <= 1e-3
    prompts = [list(range(10 + 7 * i, 10 + 7 * i + n)) for i, n in enumerate((30, 11, 23, 5))]
    limits = [12, 9, 14, 10]
    tokens, calls = _prompts_together(make(), prompts, limits, window, chunk=16)
    assert calls[0] == 4
    refs = [Generator(make()).generate(p, GenerationConfig(max_tokens=m, window=window, prefill_chunk=16)).tokens
            for p, m in zip(prompts, limits)]
    assert tokens == refs
