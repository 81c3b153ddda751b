"""`edgeattn build MODEL --target cuda --precision fp8 --kv-cache fp8`: what the bundle holds, what the manifest and
report say, opening it (CPU tensors here), and the refusals: Orin at build, a GPU without FP8 at open."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from edgeattn.errors import ConfigError, TargetError  # noqa: E402


@pytest.fixture(scope="module")
def fp8_bundle(tmp_path_factory):
    from decoder_fixtures import tiny_llama
    from edgeattn.cli.main import cli
    from click.testing import CliRunner

    model, tok = tiny_llama()
    root = tmp_path_factory.mktemp("fp8")
    model.save_pretrained(root / "hf")
    tok.save_pretrained(root / "hf")
    out = root / "tiny.cuda"
    result = CliRunner().invoke(cli, ["build", str(root / "hf"), "--target", "cuda", "--precision", "fp8",
                                      "--kv-cache", "fp8", "--arch", "none", "--window-max", "48", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return model, tok, out, result.output


def test_the_bundle_holds_fp8_weights_scales_and_the_plan(fp8_bundle):
    from safetensors.torch import load_file

    _, _, out, output = fp8_bundle
    assert "target cuda, fp8, 2 layers" in output
    tensors = load_file(str(out / "weights.safetensors"))
    assert tensors["wqkv.0"].dtype == torch.float8_e4m3fn and tensors["wqkv.0.scale"].dtype == torch.float32
    assert tensors["embed"].dtype == torch.bfloat16 and tensors["kv_scale"].shape == (2, 2, 2)
    manifest = json.loads((out / "manifest.json").read_text())
    p = manifest["precision"]
    assert p["float"] == "fp8" and p["kv_cache"] == "fp8" and p["layers"]["attention"] == "bf16"
    assert set(p["fp8"]["matrices"]) == {"wqkv", "wo", "wgu", "wd", "lm_head"}
    assert set(p["fp8"]["matrices"]["wd"]["by_tokens"].values()) <= {"fp8", "bf16"}
    assert p["fp8"]["table"]["device"].startswith("NVIDIA H200")
    d = manifest["sections"]["decoder"]
    # layers, k+v, kv heads, D x (4 + 48 FP8 rows of 1 byte + the bf16 sink buffer: 4 sinks and a spare row)
    assert d["cache_bytes_per_stream"] == 2 * 2 * 2 * 16 * (52 + 5 * 2)
    report = (out / "report.md").read_text()
    assert "fp8 weights (E4M3" in report and "KV cache: fp8" in report and "wqkv [64 x 128]" in report


def test_inspect_shows_the_fp8_plan(fp8_bundle, runner):
    from edgeattn.cli.main import cli

    result = runner.invoke(cli, ["inspect", str(fp8_bundle[2])])
    assert result.exit_code == 0, result.output
    assert "fp8 weights" in result.output and "KV cache: fp8" in result.output


def test_the_opened_bundle_follows_the_float_model(fp8_bundle):
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.cuda.bundle import open_cuda_decoder

    model, tok, out, _ = fp8_bundle
    dec = open_cuda_decoder(open_bundle(out), device="cpu")
    assert isinstance(dec.weights.t["wqkv"][0], tuple) and dec.weights.cache_dtype == torch.float8_e4m3fn
    ids = tok("The window shrinks as the device heats up", add_special_tokens=False).input_ids
    cache = dec.new_cache(1)
    logits = dec.step(cache, [0], [ids], 0)[0]  # [S, V]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    cos = (logits * ref).sum(-1) / (((logits ** 2).sum(-1) * (ref ** 2).sum(-1)) ** 0.5)
    assert float(cos.min()) > 0.98, cos


def test_fp8_for_orin_is_refused_at_build(tmp_path):
    from edgeattn.bundle.cuda_build import CudaBuildConfig

    for kw in ({"precision": "fp8"}, {"kv_cache": "fp8"}):
        with pytest.raises(ConfigError, match=r"FP8 needs sm_89 or later .*found sm_87 in --arch"):
            CudaBuildConfig(out=tmp_path / "b", archs=("sm_87", "sm_90"), **kw)
    CudaBuildConfig(out=tmp_path / "b", precision="fp8", kv_cache="fp8", archs=("sm_90", "sm_110"))


def test_the_command_line_refuses_orin_and_writes_nothing(tmp_path, runner):
    from edgeattn.cli.main import cli

    result = runner.invoke(cli, ["build", "smollm2", "--target", "cuda", "--precision", "fp8", "--arch", "sm_87",
                                 "--out", str(tmp_path / "b")])
    assert result.exit_code == ConfigError.exit_code and "FP8 needs sm_89" in result.output
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("gpu, sm", [("NVIDIA Jetson AGX Orin", (8, 7)), ("NVIDIA A100-SXM4-80GB", (8, 0))])
def test_opening_on_a_gpu_without_fp8_names_the_gpu(fp8_bundle, monkeypatch, gpu, sm):
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.cuda.bundle import open_cuda_decoder

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: sm)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu)
    with pytest.raises(TargetError, match=rf"FP8 needs a GPU of sm_89 or later .*found {gpu} \(sm_{sm[0]}{sm[1]}\), "
                                          r"which supports bf16, fp16 and int8"):
        open_cuda_decoder(open_bundle(fp8_bundle[2]))


def test_a_bf16_bundle_opens_with_an_fp8_cache_calibrated_then(tmp_path):
    from decoder_fixtures import tiny_llama
    from edgeattn.bundle.cuda_build import CudaBuildConfig, build_cuda
    from edgeattn.runtime.cuda.bundle import open_cuda_decoder

    model, tok = tiny_llama()
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    bundle = build_cuda(tmp_path / "hf", CudaBuildConfig(out=tmp_path / "b", precision="fp32", window_max=48,
                                                         archs=()))
    plain = open_cuda_decoder(bundle, device="cpu")
    dec = open_cuda_decoder(bundle, device="cpu", kv_cache="fp8")
    assert "kv_scale" not in plain.weights.t and dec.weights.t["kv_scale"].shape == (2, 2, 2)
    sink_buffers = 2 * 2 * 2 * 5 * 16 * 4  # layers, k+v, kv heads, 4 sinks + a spare row, D, fp32
    assert dec.weights.cache_bytes_per_stream() * 4 == plain.weights.cache_bytes_per_stream() + 4 * sink_buffers
    ids = tok("Heat sinks move heat away", add_special_tokens=False).input_ids
    a = plain.step(plain.new_cache(1), [0], [ids], 0)[0]
    b = dec.step(dec.new_cache(1), [0], [ids], 0)[0]
    cos = (a * b).sum(-1) / (((a ** 2).sum(-1) * (b ** 2).sum(-1)) ** 0.5)
    assert float(cos.min()) > 0.98


def test_the_build_asks_for_both_ring_kernels(tmp_path, monkeypatch):
    """The ahead-of-time kernels of a cuda bundle: the ring decode kernel (its variant name ends in -causal), the
    reduce kernel and, with an FP8 cache, the FP8 ring kernel."""
    import fnmatch

    from decoder_fixtures import tiny_llama
    from edgeattn.bundle.cuda_build import CudaBuildConfig, build_cuda
    from edgeattn.plugins.kernels import aot

    asked = []

    def fake_compile_all(config):
        asked.extend(config.only)
        (config.out_dir).mkdir(parents=True)
        return {"archs": list(config.archs), "kernels": []}

    monkeypatch.setattr(aot, "compile_all", fake_compile_all)
    model, tok = tiny_llama()
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    build_cuda(tmp_path / "hf", CudaBuildConfig(out=tmp_path / "b", precision="fp8", kv_cache="fp8", window_max=48,
                                                archs=("sm_90",)))
    for name in ("ring_decode_split-bf16-d16-causal", "decode_reduce-bf16-d16", "ring_fp8_decode_split-bf16-d16-causal"):
        assert any(fnmatch.fnmatch(name, p) for p in asked), (name, asked)
