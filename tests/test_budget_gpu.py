"""The attention budget on the GPU path: the Triton kernels (page bounds, page selection, block-sparse decode) under
TRITON_INTERPRET=1 against the float64 oracle; the ring_decode_budget op and the cuda decode step on the CPU (the
op's reference path); marked gpu, the same on CUDA with the kernels and the captured graphs."""

from __future__ import annotations

import numpy as np
import pytest

import interpreter_runs
from onnx_fixtures import has

torch = pytest.importorskip("torch")

needs_triton = pytest.mark.skipif(not has("triton"), reason="needs triton")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def budget_kernel_errors() -> dict[str, float]:
    return interpreter_runs.result("budget_kernel_errors")


@pytest.mark.slow
@pytest.mark.triton
@needs_triton
def test_the_kernels_match_the_oracle(budget_kernel_errors):
    """Bounds kept by the decode write and by the refresh (ring wraps, pages overwritten in part) equal the
    bounds recomputed from the rows; the block-sparse decode equals the oracle for k in {0, 1, 3, all}, GQA
    groups 1-3, sinks 0-4, windows below the ring and the whole ring, 1 to 4 splits; ties take the lower page; the
    spread scoring chooses the first path's set; the attention launch's own row + bounds write (1 and 4 splits)
    leaves its output unchanged and keeps the rows and bounds ring_write_bounds keeps. Bounds that also keep the sum
    of min and max (the CUDA engine's, read by the selection instead of both) are written to the same min and max
    with their sum, choose the same pages, and give the same output."""
    e = budget_kernel_errors
    assert {k for k in e if k.startswith("bounds:")} == {"bounds:decode-writes", "bounds:refresh-chunks",
                                                          "bounds:refresh-all"}
    assert all(e[k] == 0.0 for k in e if k.split(":")[0] in ("bounds", "select", "write", "sums")), e
    assert len([k for k in e if k.startswith("sums:")]) == 9, e
    assert {k for k in e if k.startswith("write:")} == {"write:output-unchanged", "write:rows-wrong", "write:bounds"}
    decode = {k: v for k, v in e.items() if k.startswith("decode:")}
    assert len(decode) == 16 and all(v < 2e-3 for v in decode.values()), decode  # fp16 storage of the output
    assert all(e[k] > 1e-2 for k in e if k.startswith("moves:")), e  # the chosen pages change the answer


@pytest.mark.triton
@needs_triton
@pytest.mark.parametrize("arch", ["sm_87", "sm_90", "sm_110"])
def test_the_budget_kernels_compile_ahead_of_time_for_jetson_and_hopper(arch):
    """Selection, block-sparse split (merged by decode_reduce) and the row + bounds write, for Orin, H100/H200, Thor."""
    from edgeattn.plugins.kernels.aot import KernelVariant, compile_variant, default_variants

    kinds = ("budget_select", "budget_decode_split", "page_bounds")
    assert {v.kind for v in default_variants()} >= set(kinds)
    kernels = {kind: compile_variant(KernelVariant(kind, "bf16", 64), arch) for kind in kinds}
    for kernel in kernels.values():
        assert kernel.cubin[:4] == b"\x7fELF" and f".entry {kernel.name}" in kernel.ptx
        assert f".target {arch}" in kernel.ptx
    assert kernels["budget_select"].params[:5] == ["Q", "Bounds", "Pos", "Window", "Pages"]
    assert kernels["budget_decode_split"].params[:9] == ["Q", "QS", "KN", "VN", "K", "V", "Pos", "Window", "Sel"]
    assert kernels["budget_decode_split"].constexprs["K_MAX"] == 64 and "Out" in kernels["budget_decode_split"].params
    assert kernels["page_bounds"].constexprs["WRITE"] is True


# --- the op and the decode step on the CPU (reference path) -------------------------------------------------------
transformers = pytest.importorskip("transformers")


def tiny(seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      rms_norm_eps=1e-5, eos_token_id=None)
    return transformers.LlamaForCausalLM(config).eval()


def test_every_page_read_is_full_attention_while_the_ring_holds_the_stream():
    """sinks 0, W = 8 and k = every page: each step reads every earlier row, so it equals the whole window."""
    from edgeattn.runtime.cuda.budget import BudgetGraph
    from edgeattn.runtime.cuda.decode_step import PackedDecoder, decode_logits

    weights = PackedDecoder.from_hf(tiny(), sinks=0, window_max=32)
    k1, v1 = weights.new_cache(2)
    k2, v2 = weights.new_cache(2)
    bounds = [torch.zeros(2, 2, 4, 2, 16) for _ in range(2)]  # pages of 8 rows
    graph = BudgetGraph(weights, k2, v2, bounds, batch=2, splits=0, k_max=4, page=8, compile="none", greedy=False)
    tokens = torch.randint(0, 96, (2, 30))
    with torch.no_grad():
        for p in range(30):
            pos = torch.tensor([p, max(p - 5, 0)])
            want = decode_logits(weights, tokens[:, p], pos, torch.tensor(0), k1, v1)
            got = graph(tokens[:, p], pos, 8, 4)
            assert torch.allclose(want, got, atol=1e-5), p
    assert torch.allclose(k1[1], k2[1], atol=1e-6)


def test_the_budget_changes_the_answer_and_the_bounds_follow_the_rows():
    """Past the ring (two wraps), W = 4 with k = 1 differs from k = 0, and the bounds the steps kept equal the
    oracle's page_bounds_np of the cache."""
    from edgeattn.attention.cached_reference import page_bounds_np
    from edgeattn.runtime.cuda.budget import BudgetGraph
    from edgeattn.runtime.cuda.decode_step import PackedDecoder

    weights = PackedDecoder.from_hf(tiny(1), sinks=2, window_max=16)
    outs = {}
    for pages in (0, 1):
        keys, values = weights.new_cache(1)
        bounds = [torch.zeros(1, 2, 4, 2, 16) for _ in range(2)]
        graph = BudgetGraph(weights, keys, values, bounds, batch=1, splits=0, k_max=1, page=4, compile="none",
                            greedy=False)
        tokens = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            outs[pages] = torch.stack([graph(tokens[p:p + 1], torch.tensor([p]), 4, pages)[0] for p in range(40)])
        for layer in range(2):
            want = page_bounds_np(keys[layer].numpy(), np.array([40]), 2, 4)
            assert np.array_equal(bounds[layer].numpy(), want)
    assert torch.allclose(outs[0][:6], outs[1][:6], atol=1e-6)  # t < sinks + W: no candidate page yet
    assert not torch.allclose(outs[0][-1], outs[1][-1], atol=1e-3)


def test_the_op_at_k_zero_equals_ring_decode():
    """ring_decode_budget with k = 0 computes ring_decode's attention (the window alone) and writes the same row."""
    import edgeattn.plugins.kernels.ring_ops  # noqa: F401

    torch.manual_seed(5)
    b, h, h_kv, d, sinks, c = 2, 4, 2, 16, 2, 34
    q, qs = torch.randn(b, h, d), torch.randn(b, h, d)
    k, v = torch.randn(b, h_kv, d), torch.randn(b, h_kv, d)
    kc, vc = torch.randn(b, h_kv, c, d), torch.randn(b, h_kv, c, d)
    kc2, vc2 = kc.clone(), vc.clone()
    bounds = torch.zeros(b, h_kv, 4, 2, d)
    pos, window = torch.tensor([50, 9]), torch.tensor(6)
    want = torch.ops.edgeattn.ring_decode(q, qs, k, v, kc, vc, pos, window, sinks, 0.0, 0)
    got = torch.ops.edgeattn.ring_decode_budget(q, qs, k, v, kc2, vc2, bounds, pos, window, torch.tensor(0), sinks,
                                                0.0, 0, 8, 4)
    assert torch.allclose(want, got, atol=1e-6) and torch.equal(kc, kc2) and torch.equal(vc, vc2)


def test_the_cuda_backend_takes_pages_in_prefill_and_decode():
    """CudaDecoder.step with pages: a prompt chunk and decode steps reading W = 16 and every page equal the whole
    window while the ring holds the stream (sinks 0); the bounds (min, max and their sum, which the selection reads)
    follow the rows; k = 0 on a cache that keeps bounds gives the window's logits bit for bit; k beyond the ring's
    pages is refused."""
    from edgeattn.attention.budget import AttentionBudget
    from edgeattn.attention.cached_reference import page_bounds_np
    from edgeattn.errors import ConfigError
    from edgeattn.runtime.cuda import budget
    from edgeattn.runtime.cuda.backend import CudaDecoder

    dec = CudaDecoder.from_hf(tiny(2), sinks=0, window_max=32, compile="none")
    assert dec.page == 16 and dec.check_budget(AttentionBudget(window=16, pages=2)).pages == 2
    with pytest.raises(ConfigError, match="0 to 2"):
        dec.check_budget(AttentionBudget(window=16, pages=3))
    rng = np.random.default_rng(0)
    prompt, tokens = rng.integers(0, 96, (2, 10)), rng.integers(0, 96, (20, 2))
    paged, plain, kept = dec.new_cache(2), dec.new_cache(2), dec.new_cache(2)
    budget.attach_bounds(kept, dec.weights)  # bounds kept from the start, read with k = 0
    for i in range(2):
        a = dec.step(paged, [i], prompt[i:i + 1], 16, last_only=True, pages=2)
        b = dec.step(plain, [i], prompt[i:i + 1], 0, last_only=True)
        dec.step(kept, [i], prompt[i:i + 1], 0, last_only=True)
        assert np.allclose(a, b, atol=1e-5)
    for p in range(20):
        a = dec.step(paged, [0, 1], tokens[p][:, None], 16, pages=2)
        b = dec.step(plain, [0, 1], tokens[p][:, None], 0)
        c = dec.step(kept, [0, 1], tokens[p][:, None], 0)
        assert np.allclose(a, b, atol=1e-5) and np.array_equal(b, c), p
    paged.swap(0, 1)  # the bounds move with their rows
    kept.move(1, 0)
    for cache in (paged, kept):
        for layer in range(2):
            want = page_bounds_np(cache.keys[layer].numpy(), cache.positions, 0, 16)
            live = cache.positions > 0
            kept_bounds = cache.bounds[layer].numpy()[live]
            assert kept_bounds.shape[-2] == budget.BOUND_SLOTS == 3
            assert np.array_equal(kept_bounds[..., :2, :], want[live])
            assert np.array_equal(kept_bounds[..., 2, :], want[live][..., 0, :] + want[live][..., 1, :])


# --- on CUDA ----------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_cuda
def test_the_cuda_op_equals_the_reference_op():
    import edgeattn.plugins.kernels.ring_ops  # noqa: F401

    torch.manual_seed(7)
    b, h, h_kv, d, sinks, wmax, page = 4, 9, 3, 64, 4, 512, 16
    dev, dt = "cuda", torch.bfloat16
    kc, vc = torch.randn(b, h_kv, sinks + wmax, d, device=dev, dtype=dt), torch.randn(b, h_kv, sinks + wmax, d,
                                                                                      device=dev, dtype=dt)
    pos = torch.tensor([3, 100, 700, 2000], device=dev)
    from edgeattn.attention.cached_reference import page_bounds_np

    bounds = torch.from_numpy(page_bounds_np(kc.float().cpu().numpy(), pos.cpu().numpy(), sinks, page)).to(dev, dt)
    for pages in (0, 1, 5, 32):
        q, qs = torch.randn(b, h, d, device=dev, dtype=dt), torch.randn(b, h, d, device=dev, dtype=dt)
        k, v = torch.randn(b, h_kv, d, device=dev, dtype=dt), torch.randn(b, h_kv, d, device=dev, dtype=dt)
        args = (q, qs, k, v)
        ref = [t.cpu().float() for t in (kc, vc, bounds)]
        got = torch.ops.edgeattn.ring_decode_budget(*args, kc, vc, bounds, pos, torch.tensor(64, device=dev),
                                                    torch.tensor(pages, device=dev), sinks, 0.0, 0, page, 32)
        want = torch.ops.edgeattn.ring_decode_budget(*(t.cpu().float() for t in args), *ref, pos.cpu(),
                                                     torch.tensor(64), torch.tensor(pages), sinks, 0.0, 0, page, 32)
        assert (got.float().cpu() - want).abs().max() < 2e-2, pages
        assert torch.equal(kc.cpu().float(), ref[0]) and torch.equal(bounds.cpu().float(), ref[2])
        pos = pos + 1


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("compile", ["none", "linked"])
def test_graph_replays_equal_eager_budget_steps_on_cuda(compile):
    from edgeattn.runtime.cuda.budget import BudgetGraph, budget_logits
    from edgeattn.runtime.cuda.decode_step import PackedDecoder

    weights = PackedDecoder.from_hf(tiny().to("cuda"), sinks=4, window_max=64)
    tokens = torch.randint(0, 96, (3, 150), device="cuda")
    k1, v1 = weights.new_cache(3)
    k2, v2 = weights.new_cache(3)
    b1 = [torch.zeros(3, 2, 4, 2, 16, device="cuda") for _ in range(2)]
    b2 = [torch.zeros(3, 2, 4, 2, 16, device="cuda") for _ in range(2)]
    graph = BudgetGraph(weights, k2, v2, b2, batch=3, splits=1, k_max=2, page=16, compile=compile)
    for p in range(150):
        pos = torch.full((3,), p, device="cuda")
        want = budget_logits(weights, tokens[:, p], pos, torch.tensor(16, device="cuda"),
                             torch.tensor(2, device="cuda"), k1, v1, b1, splits=1, k_max=2, page=16).argmax(-1)
        assert torch.equal(want, graph(tokens[:, p], pos, 16, 2)), p
    from edgeattn.attention.cached_reference import page_bounds_np

    for keys, bounds in ((k1, b1), (k2, b2)):  # the bounds kept equal the bounds of the rows, recomputed
        want = page_bounds_np(keys[1].cpu().numpy(), np.full(3, 150), 4, 16)
        assert np.array_equal(bounds[1].cpu().numpy(), want)
