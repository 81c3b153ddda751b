"""The decode engine on CUDA: `TorchDecoderModel` (the cache on the GPU, decode steps replayed as CUDA graphs)
is a DecoderBackend like a bundle's, so the Generator and the server's scheduler drive it unchanged and give the
same tokens (with slots moved and swapped in the GPU cache)."""

from __future__ import annotations

import threading
import time

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
