"""FP8 on the cuda target: the FP8 linear (runtime/cuda/fp8.py) emulated on the CPU against float references, the
choice table, the FP8 KV cache (runtime/cuda/fp8_cache.py) through the decode step and prefill, the FP8 ring
kernel under TRITON_INTERPRET=1, refusals on GPUs without FP8, and (marked gpu) the same on CUDA."""

from __future__ import annotations

import pytest

import interpreter_runs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from edgeattn.errors import BuildError, TargetError  # noqa: E402
from edgeattn.runtime.cuda import fp8, fp8_build, fp8_cache  # noqa: E402
from edgeattn.runtime.cuda.decode_step import DecodeGraph, PackedDecoder, decode_linked, decode_logits  # noqa: E402
from edgeattn.runtime.cuda.prefill import prefill_logits  # noqa: E402

E4M3_STEP = 2.0 ** -3  # E4M3 keeps 3 mantissa bits: a value rounds by at most half a step, 1/16 relative
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def tiny(seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      rms_norm_eps=1e-5, eos_token_id=None)
    return transformers.LlamaForCausalLM(config).eval()


# --- the FP8 linear ------------------------------------------------------------------------------------------
def test_weight_rows_round_within_the_e4m3_bound_and_keep_their_amax():
    w = torch.randn(48, 64) * torch.logspace(-3, 2, 48)[:, None]  # rows five decades apart
    w8, scale = fp8.quantize_weight(w, "w")
    assert w8.dtype == torch.float8_e4m3fn and scale.shape == (48,)
    back = fp8.dequantize(w8, scale, torch.float32)
    assert torch.allclose(back.abs().amax(1), w.abs().amax(1), rtol=1e-6)  # amax maps to 448 exactly
    err = (back - w).abs() / w.abs().amax(1, keepdim=True)
    assert float(err.max()) <= E4M3_STEP * 448 / 2 / 256  # at most half a step of the row's top binade


def test_fp8_linear_matches_the_float_product_within_the_fp8_bound():
    torch.manual_seed(0)
    x = torch.randn(37, 128, dtype=torch.bfloat16)  # 37 tokens: padded to 48 inside
    w = torch.randn(80, 128, dtype=torch.bfloat16) / 11
    w8, scale = fp8.quantize_weight(w, "w")
    y = fp8._fp8_mm(x, w8, scale.reshape(1, -1), torch.bfloat16)
    assert y.shape == (37, 80) and y.dtype == torch.bfloat16
    exact = x.double() @ w.double().t()
    assert rel(y, exact) < 0.06  # two E4M3 roundings (each < 1/16 relative, ~1/40 rms) and bf16 output
    # and it is exactly the product of the dequantized operands: x per token, w per row
    xs = x.float().abs().amax(1, keepdim=True) / 448
    x_deq = (x.float() / xs).to(torch.float8_e4m3fn).float() * xs
    assert rel(y, (x_deq @ fp8.dequantize(w8, scale, torch.float32).t()).bfloat16()) < 5e-3


def test_bad_scales_stop_the_build_and_name_the_row():
    for bad, what in ((0.0, "amax 0.0"), (float("inf"), "amax inf"), (float("nan"), "amax nan")):
        w = torch.randn(8, 16)
        w[5] = bad
        with pytest.raises(BuildError, match=f"row 5 with {what}"):
            fp8.quantize_weight(w, "wo.3")


def test_the_table_picks_bf16_for_small_products_and_fp8_for_large_ones(monkeypatch):
    table = {"device": "test", "measured": "test", "how": "test", "tokens": [1, 64, 1024],
             "speedup": {"576x960": [0.4, 0.9, 1.3], "4096x4096": [0.6, 1.2, 1.6]}}
    monkeypatch.setattr(fp8, "TABLE", table)
    assert [fp8.bucket(m) for m in (1, 63, 64, 1000, 1024, 10**6)] == [1, 1, 64, 64, 1024, 1024]
    assert [fp8.choice(m, 576, 960) for m in (1, 64, 2048)] == ["bf16", "bf16", "fp8"]
    assert fp8.choice(64, 4096, 4096) == "fp8"  # 1.2 >= MIN_GAIN
    assert fp8.choice(64, 3584, 4608) == "fp8"  # unmeasured: the nearest measured size (4096 x 4096)
    assert fp8.choice(2048, 570, 960) == "bf16"  # K not a multiple of 16: torch._scaled_mm cannot take it


def test_linear_takes_the_bf16_copy_where_the_table_says_fp8_does_not_pay(monkeypatch):
    monkeypatch.setattr(fp8, "TABLE", {"device": "t", "measured": "t", "how": "t", "tokens": [1, 32],
                                       "speedup": {"64x32": [0.5, 2.0]}})
    w = torch.randn(32, 64)
    w8, scale = fp8.quantize_weight(w, "w")
    t = fp8.fp8_weights({"embed": torch.zeros(2, 2), "w": w8, "w.scale": scale})["w"]
    assert t[2] is not None and t[1].shape == (1, 32)  # a bf16 copy is kept: some token counts take it
    small, large = torch.randn(4, 64), torch.randn(40, 64)
    assert torch.equal(fp8.linear(small, t), torch.nn.functional.linear(small, t[2]))  # bf16 on FP8 weights
    assert not torch.equal(fp8.linear(large, t), torch.nn.functional.linear(large, t[2]))  # activations rounded
    assert rel(fp8.linear(large, t), large @ w.t()) < 0.06
    monkeypatch.setattr(fp8, "TABLE", {"device": "t", "measured": "t", "how": "t", "tokens": [1],
                                       "speedup": {"64x32": [2.0]}})
    assert fp8.fp8_weights({"embed": torch.zeros(2, 2), "w": w8, "w.scale": scale})["w"][2] is None  # FP8 always


def test_the_plan_names_every_matrix_and_the_table():
    weights = PackedDecoder.from_hf(tiny(), sinks=2, window_max=16)
    plan = fp8.precision_plan(weights.shape)
    assert set(plan["matrices"]) == {"wqkv", "wo", "wgu", "wd", "lm_head"}
    assert (plan["matrices"]["wqkv"]["k"], plan["matrices"]["wqkv"]["n"]) == (64, 128)
    assert set(plan["matrices"]["wgu"]["by_tokens"].values()) <= {"fp8", "bf16"}
    assert plan["table"]["device"] and plan["table"]["tokens"] == fp8.TABLE["tokens"]


# --- the decode step and prefill with FP8 weights and an FP8 cache --------------------------------------------
def fp8_decoder(weights, prompts, *, cache=True, linear=True):
    tensors = weights.state_dict()
    if linear:
        tensors = fp8.fp8_weights(fp8.quantize_state_dict(tensors, weights.shape.layers))
    if cache:
        tensors["kv_scale"] = fp8_build.calibrate(weights, prompts)
    return PackedDecoder.from_state_dict(weights.shape, tensors, weights.rope_scaling)


def steps(weights, tokens, fn=decode_logits, window=0):
    b, n = tokens.shape
    keys, values = weights.new_cache(b)
    with torch.no_grad():
        out = [fn(weights, tokens[:, p], torch.full((b,), p), torch.tensor(window), keys, values) for p in range(n)]
    return torch.stack(out, 1), keys, values


def test_fp8_weights_and_cache_follow_the_float_decoder():
    weights = PackedDecoder.from_hf(tiny(), sinks=2, window_max=16)
    torch.manual_seed(1)
    tokens = torch.randint(0, 96, (2, 30))  # wraps the ring of 16
    ref, _, _ = steps(weights, tokens)
    both = fp8_decoder(weights, [torch.randint(0, 96, (24,)).tolist()])
    assert both.cache_dtype == torch.float8_e4m3fn
    s = weights.shape  # fp32 here: a quarter, and the float sink buffers (sinks + a spare row)
    sink_bytes = 2 * s.layers * s.kv_heads * (s.sinks + 1) * s.head_dim * 4
    assert both.cache_bytes_per_stream() * 4 == weights.cache_bytes_per_stream() + 4 * sink_bytes
    got, keys, _ = steps(both, tokens)
    assert keys[0].dtype == torch.float8_e4m3fn and keys[0].float().abs().max() > 0
    assert rel(got, ref) < 0.08, rel(got, ref)
    linked, _, _ = steps(both, tokens, decode_linked)  # the cache written inside the linked pieces
    assert torch.allclose(linked, got, atol=1e-5)


def test_the_cache_holds_rows_over_their_per_head_scale():
    weights = PackedDecoder.from_hf(tiny(), sinks=2, window_max=16)
    w8 = fp8_decoder(weights, [list(range(20))], linear=False)
    tokens = torch.randint(0, 96, (1, 10))
    _, k_float, _ = steps(weights, tokens)
    _, k8, _ = steps(w8, tokens)
    scale = w8.t["kv_scale"][0, 0]  # layer 0's key scales [H_kv] (its keys do not depend on the cache)
    back = fp8_cache.load(k8[0][0], scale, torch.float32)  # [H_kv, C, D]
    assert torch.allclose(back[:, :10], k_float[0][0, :, :10], rtol=E4M3_STEP / 2, atol=float(scale.max()) * 2**-6)


def test_prefill_writes_the_same_fp8_rows_the_steps_write():
    weights = fp8_decoder(PackedDecoder.from_hf(tiny(), sinks=2, window_max=16), [list(range(30))])
    tokens = torch.randint(0, 96, (1, 12))
    by_steps, k_steps, _ = steps(weights, tokens)
    keys, values = weights.new_cache(1)
    with torch.no_grad():
        prefill_logits(weights, tokens[0, :8], 0, 0, keys, values, 0)
        last = prefill_logits(weights, tokens[0, 8:], 8, 0, keys, values, 0)  # reads the first chunk's FP8 rows
    assert torch.equal(keys[1].view(torch.uint8)[:, :, :12], k_steps[1].view(torch.uint8)[:, :, :12])
    assert torch.allclose(keys.sinks[1][:, :, :2], k_steps.sinks[1][:, :, :2], rtol=1e-5)  # the float sink rows
    assert torch.allclose(last[0], by_steps[0, -1], atol=1e-4)


def test_the_sink_rows_are_read_from_the_float_buffers():
    """An FP8 cache keeps its sink rows also in the weights' float type (fp8_cache.Layers.sinks) and attention
    reads them from there: wiping the FP8 sink rows changes nothing, wiping the buffers changes the logits."""
    float_weights = PackedDecoder.from_hf(tiny(), sinks=2, window_max=16)
    weights = fp8_decoder(float_weights, [list(range(30))], linear=False)
    tokens = torch.randint(0, 96, (2, 24))
    _, keys, values = steps(weights, tokens[:, :-1])
    _, k_float, _ = steps(float_weights, tokens[:, :2])
    # the buffers hold x / scale of positions 0 and 1 in the float type (fp32 here); row 2 is the spare row
    assert keys.sinks[0].shape == (2, 2, 3, 16) and keys.sinks[0].dtype == torch.float32
    kept = fp8_cache.load(keys[0][:, :, :2], weights.t["kv_scale"][0, 0], torch.float32, keys.sinks[0])
    assert torch.allclose(kept, k_float[0][:, :, :2], atol=1e-6)  # layer 0's keys do not depend on the cache

    def next_logits():
        with torch.no_grad():
            return decode_logits(weights, tokens[:, -1], torch.full((2,), 23), torch.tensor(0), keys, values)

    k0, v0 = [t.clone() for t in keys], [t.clone() for t in values]
    want = next_logits()
    for layers, saved in ((keys, k0), (values, v0)):
        for t, t0 in zip(layers, saved):
            t.copy_(t0)
            t[:, :, :2] = 0  # the FP8 copies of the sink rows: not read
    assert torch.equal(next_logits(), want)
    for layers in (keys.sinks, values.sinks):
        for t in layers:
            t[:, :, :2] = 0
    assert not torch.allclose(next_logits(), want, atol=1e-3)


def test_calibration_refuses_zero_scales():
    weights = PackedDecoder.from_hf(tiny(), sinks=2, window_max=16)
    with pytest.raises(BuildError, match="no prompt"):
        fp8_build.calibrate(weights, [])


# --- the kernel ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fp8_kernel_errors() -> dict[str, float]:
    return interpreter_runs.result("fp8_kernel_errors")


@pytest.mark.triton
def test_the_fp8_ring_kernel_matches_the_dequantized_reference_interpreted(fp8_kernel_errors):
    for name, err in fp8_kernel_errors.items():
        if name.endswith("unscaled"):
            assert err > 0.05, (name, err)  # reading without the scales is wrong: the test can see them
        elif name.endswith("moved"):
            assert err > 1e-3, (name, err)  # the float sink rows give another answer than their FP8 copies
        else:
            assert err < 2e-3, (name, err)  # fp16 queries and probabilities, fp32 accumulation


@pytest.mark.triton
@pytest.mark.parametrize("arch", ["sm_90", "sm_110"])
def test_the_fp8_kernel_compiles_ahead_of_time(arch):
    from edgeattn.plugins.kernels.aot import KernelVariant, compile_variant

    kernel = compile_variant(KernelVariant("ring_fp8_decode_split", "bf16", 64), arch)
    assert kernel.params[:6] == ["Q", "QS", "K", "V", "KS", "VS"] and kernel.params[-3:] == ["Out", "stride_ob",
                                                                                              "stride_oh"]
    assert "e4m3" in kernel.ptx and kernel.cubin[:4] == b"\x7fELF"


def test_the_fp8_kernel_is_refused_for_orin_and_left_out_of_its_builds(tmp_path):
    from edgeattn.errors import ConfigError
    from edgeattn.plugins.kernels.aot import CompileConfig, KernelVariant, compile_variant

    with pytest.raises(ConfigError, match="need sm_89 or later, found sm_87"):
        compile_variant(KernelVariant("ring_fp8_decode_split", "bf16", 64), "sm_87")
    names = [v.name for v in CompileConfig(out_dir=tmp_path, archs=("sm_87",), only=("ring_fp8*",)).variants()]
    assert names  # the variant exists; compile_all skips it for sm_87 (an FP8 bundle is refused there at build)


# --- refusals ------------------------------------------------------------------------------------------------
def test_an_orin_or_ampere_gpu_is_refused_by_name():
    with pytest.raises(TargetError, match=r"found NVIDIA Jetson AGX Orin \(sm_87\).*bf16"):
        fp8.check_fp8_gpu("NVIDIA Jetson AGX Orin", 87, "bundle")
    fp8.check_fp8_gpu("NVIDIA H200", 90, "bundle")  # Hopper: no error
    fp8.check_fp8_gpu("NVIDIA Jetson AGX Thor", 110, "bundle")


# --- on the GPU ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@cuda
def test_scaled_mm_equals_the_emulation_on_cuda():
    torch.manual_seed(0)
    for m in (1, 16, 37, 300):
        x = torch.randn(m, 576, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(960, 576, dtype=torch.bfloat16, device="cuda") / 24
        w8, scale = fp8.quantize_weight(w, "w")
        got = fp8._fp8_mm(x, w8, scale.reshape(1, -1), torch.bfloat16)
        want = fp8._fp8_mm(x.cpu(), w8.cpu(), scale.reshape(1, -1).cpu(), torch.bfloat16)
        assert rel(got.cpu(), want) < 1e-2, m  # the same operands; accumulation order and bf16 rounding differ
        assert rel(got, x.double() @ w.double().t()) < 0.06


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("mode", ["none", "linked"])
def test_fp8_graph_replays_equal_eager_steps_on_cuda(mode):
    model = tiny().to("cuda", torch.bfloat16)
    weights = fp8_decoder(PackedDecoder.from_hf(model, sinks=4, window_max=64), [list(range(40))])
    tokens = torch.randint(0, 96, (3, 40), device="cuda")
    k1, v1 = weights.new_cache(3)
    k2, v2 = weights.new_cache(3)
    graph = DecodeGraph(weights, k2, v2, batch=3, splits=1, compile=mode)
    same = 0
    for p in range(40):
        pos = torch.full((3,), p, device="cuda")
        want = decode_logits(weights, tokens[:, p], pos, torch.tensor(16, device="cuda"), k1, v1).argmax(-1)
        same += int(torch.equal(want, graph(tokens[:, p], pos, 16)))
    # eager: equal token for token; compiled pieces keep k and v in fp32 before the FP8 rounding (eager rounds
    # them to bf16 first), so a few cache bytes sit one E4M3 step apart
    equal_bytes = float((k1[0].view(torch.uint8) == k2[0].view(torch.uint8)).float().mean())
    assert (same, equal_bytes) == (40, 1.0) if mode == "none" else (same >= 36 and equal_bytes > 0.97), (same,
                                                                                                  equal_bytes)


def test_the_fused_mode_falls_back_to_the_eager_pieces_for_fp8():
    """The fused step's kernels read bf16 matrices and a bf16 cache: with FP8 weights or cache it runs the eager
    step instead of reading FP8 bytes as bf16."""
    from edgeattn.runtime.cuda.decode_step import decode_fused

    weights = fp8_decoder(PackedDecoder.from_hf(tiny(), sinks=2, window_max=16), [list(range(20))])
    tokens = torch.randint(0, 96, (2, 6))
    want, _, _ = steps(weights, tokens)
    got, _, _ = steps(weights, tokens, decode_fused)
    assert torch.equal(got, want)


def test_auto_takes_the_linked_pieces_for_fp8():
    weights = PackedDecoder.from_hf(tiny(), sinks=2, window_max=16)
    both = fp8_decoder(weights, [list(range(20))])
    keys, values = both.new_cache(2)
    assert DecodeGraph(both, keys, values, batch=2, compile="auto").compile == "linked"
    keys, values = weights.new_cache(2)
    assert DecodeGraph(weights, keys, values, batch=2, compile="auto").compile == "fused"


def test_the_float_sink_rows_move_and_swap_with_their_stream():
    from edgeattn.runtime.cuda.backend import CudaCache

    weights = fp8_decoder(PackedDecoder.from_hf(tiny(), sinks=2, window_max=16), [list(range(20))], linear=False)
    cache = CudaCache(weights, 3)
    assert len(cache.sinks) == 2 * weights.shape.layers
    for i, t in enumerate(cache.sinks):
        t.copy_(torch.arange(t.numel(), dtype=t.dtype).reshape(t.shape) + i)
    before = [t.clone() for t in cache.sinks]
    cache.positions[:] = [5, 0, 7]
    cache.move(0, 1)
    assert all(torch.equal(t[1], b[0]) for t, b in zip(cache.sinks, before))
    cache.swap(1, 2)
    assert all(torch.equal(t[2], b[0]) and torch.equal(t[1], b[2]) for t, b in zip(cache.sinks, before))
    ring = sum(t.numel() for t in cache.keys + cache.values)  # FP8: a byte a value
    assert cache.nbytes == ring + sum(t.numel() * t.element_size() for t in cache.sinks)
