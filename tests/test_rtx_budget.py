"""The attention budget on TensorRT's plugin: a decoder exported with pages builds with its cached attention nodes
on the plugin (TensorRT for RTX, no GPU needed to build); what the plugin does with its buffers (`run_cached`:
attention over the cache as it was, then the chunk's rows and their pages' bounds written in place) against the
float64 oracle on CPU tensors, and, marked gpu, its CUDA form (the budget's Triton kernels) against the CPU one."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_fixtures import has

torch = pytest.importorskip("torch")

SINKS, WMAX, PAGE, HKV, GROUP, D = 4, 64, 16, 2, 3, 32
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_triton = pytest.mark.skipif(not has("triton"), reason="needs triton")


def _stream(seed: int, steps: list[int], batch: int = 2):
    """Chunks of random q, q_sink, k, v per step (sizes `steps`), the streams starting at different positions."""
    g = torch.Generator().manual_seed(seed)
    for s in steps:
        q, q_sink = (torch.randn(batch, HKV * GROUP, s, D, generator=g) for _ in range(2))
        k, v = (torch.randn(batch, HKV, s, D, generator=g) for _ in range(2))
        k[:, :, :, :4] += 3 * torch.randn(batch, HKV, s, 1, generator=g)  # pages whose keys point apart
        yield q, q_sink, k, v


def _run(device: str, pages: int, window: int, steps: list[int], starts=(0, 9)):
    """Every step's output and, after the last, the cache and bounds, run_cached over one cache on `device`."""
    from edgeattn.attention.cached_reference import cached_attention_np, page_bounds_np
    from edgeattn.plugins.tensorrt.rtx import run_cached

    dt = torch.float32
    b = len(starts)
    g = torch.Generator().manual_seed(1)  # rows below each stream's start are filled, the rest not yet
    past_k, past_v = (torch.randn(b, HKV, SINKS + WMAX, D, generator=g, dtype=dt) for _ in range(2))
    bounds = torch.from_numpy(page_bounds_np(past_k.numpy(), np.array(starts), SINKS, PAGE))
    past_k, past_v, bounds = past_k.to(device), past_v.to(device), bounds.to(device)
    pos = torch.tensor(starts, dtype=torch.int64, device=device)
    win = torch.tensor(window, dtype=torch.int64, device=device)
    k_pages = torch.tensor(pages, dtype=torch.int64, device=device)
    outs, errors = [], []
    for q, q_sink, k, v in _stream(0, steps, b):
        cpu = [t.double().numpy() for t in (q, q_sink, k, v)]
        want = cached_attention_np(*cpu, past_k.cpu().double().numpy(), past_v.cpu().double().numpy(),
                                   pos.cpu().numpy(), window, sinks=SINKS, pages=pages, page=PAGE,
                                   key_bounds=bounds.cpu().double().numpy())
        got = run_cached(*(t.to(device) for t in (q, q_sink, k, v)), past_k, past_v, pos, win, k_pages, bounds,
                         sinks=SINKS)
        outs.append(got.cpu())
        errors.append(float(np.abs(got.cpu().double().numpy() - want).max()))
        pos += q.shape[2]
        recomputed = page_bounds_np(past_k.cpu().numpy(), pos.cpu().numpy(), SINKS, PAGE)
        assert np.array_equal(bounds.cpu().numpy(), recomputed), "the bounds left by the step are not the rows' own"
    return outs, errors, past_k.cpu(), past_v.cpu(), bounds.cpu()


STEPS = [20, 1, 1, 37, 1, 1, 1, 30, 1, 1]  # prefill chunks and one-token steps; the ring (64 rows) wraps twice


@pytest.mark.parametrize("pages,window", [(2, 16), (0, 16), (4, 0)])
def test_the_plugins_step_on_cpu_tensors_matches_the_oracle(pages, window):
    """Outputs within 1e-5 of the float64 oracle read over the cache as it was, and the bounds the plugin leaves
    equal the bounds recomputed from the rows it wrote (checked in _run), at every step."""
    _, errors, *_ = _run("cpu", pages, window, STEPS)
    assert max(errors) < 1e-5, errors


def test_the_pages_change_what_the_plugin_reads():
    """The same stream with k = 2 pages and k = 0 (the window alone) gives different outputs after the ring holds
    old pages: the budget's inputs reach the attention."""
    with_pages, *_ = _run("cpu", 2, 16, STEPS)
    window_only, *_ = _run("cpu", 0, 16, STEPS)
    assert float((with_pages[-1] - window_only[-1]).abs().max()) > 1e-2


@pytest.mark.gpu
@needs_cuda
@needs_triton
@pytest.mark.parametrize("pages,window", [(2, 16), (4, 0)])
def test_the_plugins_step_on_cuda_matches_its_cpu_form(pages, window):
    """On CUDA a one-token step runs the budget's Triton kernels (the attention launch writes the row and its
    page's bounds): outputs, cache and bounds equal the CPU form's over the same steps."""
    cpu = _run("cpu", pages, window, STEPS)
    gpu = _run("cuda", pages, window, STEPS)
    assert max(gpu[1]) < 1e-2, gpu[1]  # against the oracle (the kernels' products may round as tf32; another
    # page chosen moves an output by more: test_the_pages_change_what_the_plugin_reads)
    for a, b in zip(cpu[2:], gpu[2:]):
        assert torch.equal(a, b)


@pytest.mark.rtx
@pytest.mark.skipif(not has("tensorrt_rtx"), reason="needs tensorrt-rtx")
def test_a_decoder_with_pages_builds_with_its_cached_attention_on_the_plugin(tmp_path, monkeypatch):
    """A tiny Llama exported with pages of 16 (the op's 10 inputs) builds for the rtx target with both layers on the
    plugin, nothing kept on the body, and the bundle records its page size."""
    from decoder_fixtures import SINKS as DEC_SINKS, WINDOW_MAX, requires_decoder_stack, tiny_llama

    if requires_decoder_stack.args[0]:
        pytest.skip(requires_decoder_stack.kwargs["reason"])
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder.export import DecoderExportConfig, export_decoder_model

    model, tok = tiny_llama()  # before the cache moves: SmolLM2's tokenizer comes from the user's cache
    onnx_path = export_decoder_model(model, tok, tmp_path / "tiny_paged.onnx",
                                     DecoderExportConfig(sinks=DEC_SINKS, window_max=WINDOW_MAX, page=16))
    monkeypatch.setenv("EDGEATTN_CACHE_DIR", str(tmp_path / "cache"))  # the engine's timing cache
    pages = WINDOW_MAX // 16
    bundle = build(onnx_path, BuildConfig(target="rtx", out=tmp_path / "rtx.edgeattn", seq=(1, 1, 32),
                                          dims=(("cache", (DEC_SINKS + WINDOW_MAX,) * 3), ("pages", (pages,) * 3))))
    m = bundle.manifest
    assert m.artifact == "model.engine" and m.sections["engine"]["plugin_registered"] is True
    assert [a["to"] for a in m.sections["engine"]["attention"]] == ["plugin", "plugin"], m.sections["engine"]
    assert not m.sections["problems"]
    assert m.sections["decoder"]["page"] == 16
