"""FP8 weights rounded with error feedback (runtime/cuda/fp8_gptq.py): the grid is round-to-nearest's, the product's
output error on correlated inputs is smaller, uncorrelated inputs give round-to-nearest itself, the Hessians are
the decoder's own product inputs (against the Hugging Face modules' inputs), and the build records what it did or
refuses calibration text that is too short, writing nothing."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from edgeattn.errors import BuildError, ConfigError  # noqa: E402
from edgeattn.runtime.cuda import fp8, fp8_gptq  # noqa: E402


def correlated_inputs(k=96, tokens=2048, seed=0):
    """Inputs whose features share a few strong directions (like a transformer's), and their Hessian X^T X."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, 8, generator=g) @ torch.randn(8, k, generator=g) * 3 + torch.randn(tokens, k, generator=g)
    x[:, 5] *= 20  # an outlier feature
    return x, x.T @ x


def test_error_feedback_keeps_the_grid_and_cuts_the_output_error():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 96, generator=g) / 10
    x, h = correlated_inputs()
    w8, scale = fp8_gptq.round_gptq(w, h)
    n8, n_scale = fp8.quantize_weight(w, "w")
    assert w8.dtype == torch.float8_e4m3fn and torch.equal(scale, n_scale)  # same scales: same bytes, same kernels
    ref = x.double() @ w.double().T
    err = lambda q, s: float((x.double() @ fp8.dequantize(q, s, torch.float64).T - ref).norm() / ref.norm())  # noqa: E731
    gptq, nearest = err(w8, scale), err(n8, n_scale)
    assert gptq < 0.7 * nearest, (gptq, nearest)
    # output_error is the same quantity, squared, from the Hessian alone
    assert fp8_gptq.output_error(w, w8, scale, h) == pytest.approx(gptq ** 2, rel=1e-3)
    assert 0.0 < float((fp8.dequantize(w8, scale, torch.float32) - w).abs().max() / w.abs().max()) < 0.5


def test_uncorrelated_inputs_give_round_to_nearest_exactly():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(32, 48, generator=g)
    h = torch.diag(torch.rand(48, generator=g) + 0.5)  # independent inputs: an error has nowhere to go
    w8, scale = fp8_gptq.round_gptq(w, h, block=16)
    n8, _ = fp8.quantize_weight(w, "w")
    assert torch.equal(w8.view(torch.uint8), n8.view(torch.uint8))


def test_bad_hessians_and_weights_are_refused():
    w = torch.randn(8, 16)
    with pytest.raises(BuildError, match=r"expected a \[16, 16\] Hessian for wd.3, found \[8, 8\]"):
        fp8_gptq.round_gptq(w, torch.eye(8), what="wd.3")
    with pytest.raises(BuildError, match="not positive definite"):
        fp8_gptq.round_gptq(w, torch.full((16, 16), float("nan")), what="wd.3")
    w[2] = 0
    with pytest.raises(BuildError, match="row 2"):  # the scale check of round-to-nearest, before any work
        fp8_gptq.round_gptq(w, torch.eye(16), what="wd.3")


def test_the_hessians_are_the_decoders_own_product_inputs():
    from decoder_fixtures import tiny_llama
    from edgeattn.runtime.cuda.decode_step import PackedDecoder

    model, tok = tiny_llama()
    model = model.float().eval()
    packed = PackedDecoder.from_hf(model, sinks=2, window_max=64)
    prompts = [list(range(5, 45)), list(range(50, 90, 2))]
    seen: dict[str, torch.Tensor] = {}

    def hook(name):
        def f(module, args, out):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).double()
            seen[name] = seen.get(name, 0) + x.T @ x
        return f

    layer = model.model.layers[1]
    handles = [m.register_forward_hook(hook(n)) for n, m in (("wqkv.1", layer.self_attn.q_proj),
                                                               ("wgu.1", layer.mlp.gate_proj),
                                                               ("wd.1", layer.mlp.down_proj))]
    with torch.no_grad():
        for ids in prompts:
            model(torch.tensor([ids]))
    for handle in handles:
        handle.remove()
    with pytest.raises(BuildError, match="at least 256 calibration tokens, found 60"):
        fp8_gptq.input_hessians(packed, prompts)
    hessians, tokens = fp8_gptq.input_hessians(packed, prompts * 5)
    assert tokens == 300 and set(hessians) == {f"{m}.{i}" for m in fp8.MATRICES for i in range(2)}
    for name, ref in seen.items():
        got = hessians[name].double() / 5
        assert float((got - ref).norm() / ref.norm()) < 1e-4, name


def test_the_build_rounds_with_error_feedback_and_records_it(tmp_path):
    from decoder_fixtures import tiny_llama
    from edgeattn.bundle.cuda_build import CudaBuildConfig, build_cuda
    from edgeattn.bundle.folder import open_bundle

    model, tok = tiny_llama()
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    text = tmp_path / "calibration.txt"
    text.write_text("\n".join(f"Document {i}: the heat sink of board {i} moves heat into the air around it, and "
                              f"the fan turns faster when the board is warm." for i in range(40)))
    short = tmp_path / "short.txt"
    short.write_text("Too short.\n")
    with pytest.raises(BuildError, match="at least 256 calibration tokens"):
        build_cuda(tmp_path / "hf", CudaBuildConfig(out=tmp_path / "bad", precision="fp8", window_max=48, archs=(),
                                                    calibration=short))
    assert not (tmp_path / "bad").exists()
    bundle = build_cuda(tmp_path / "hf", CudaBuildConfig(out=tmp_path / "b", precision="fp8", window_max=48,
                                                         archs=(), calibration=text))
    rounding = json.loads((tmp_path / "b" / "manifest.json").read_text())["precision"]["fp8"]["rounding"]
    assert rounding["method"] == "gptq" and rounding["calibration"].startswith(str(text))
    assert rounding["calibration_tokens"] >= 256
    assert rounding["output_error"]["gptq"] < rounding["output_error"]["nearest"]
    assert "with error feedback (GPTQ)" in (tmp_path / "b" / "report.md").read_text()
    near = build_cuda(tmp_path / "hf", CudaBuildConfig(out=tmp_path / "n", precision="fp8", window_max=48, archs=(),
                                                       fp8_rounding="nearest"))
    assert json.loads((tmp_path / "n" / "manifest.json").read_text())["precision"]["fp8"]["rounding"] == \
        {"method": "nearest"}
    assert open_bundle(bundle.path).manifest.precision["float"] == "fp8" and near.path.is_dir()


def test_bad_rounding_options_are_refused(tmp_path):
    from edgeattn.bundle.cuda_build import CudaBuildConfig

    with pytest.raises(ConfigError, match="fp8_rounding: expected gptq or nearest, found 'best'"):
        CudaBuildConfig(out=tmp_path / "b", precision="fp8", fp8_rounding="best")
    with pytest.raises(ConfigError, match="calibration: expected a text file"):
        CudaBuildConfig(out=tmp_path / "b", precision="fp8", calibration=tmp_path / "none.txt")
