"""`edgeattn kernels compile`: PTX + cubin + index for sm_87 and sm_90 without a GPU; TensorRT launch rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeattn.cli.main import cli
from onnx_fixtures import has

pytestmark = [pytest.mark.triton, pytest.mark.skipif(not has("triton"), reason="needs triton")]

ONLY = "prefill-bf16-d64-causal,decode_reduce-fp16-d64"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict, str]:
    from click.testing import CliRunner

    out = tmp_path_factory.mktemp("kernels") / "k"
    result = CliRunner().invoke(cli, ["kernels", "compile", "--arch", "sm_87,sm_90", "--out", str(out), "--only", ONLY])
    assert result.exit_code == 0, result.output
    return out, json.loads((out / "index.json").read_text()), result.output


def test_index_lists_every_variant_and_arch(built):
    out, index, _ = built
    assert index["format"] == "edgeattn-kernels/1" and index["archs"] == ["sm_87", "sm_90"]
    got = {(row["variant"], row["arch"]) for row in index["kernels"]}
    assert got == {(v, a) for v in ONLY.split(",") for a in ("sm_87", "sm_90")}
    for row in index["kernels"]:
        assert row["num_warps"] in (4, 8) and row["threads"] == 32 * row["num_warps"]
        assert isinstance(row["shared"], int) and row["constexprs"]["HEAD_DIM"] == 64
        assert (out / row["ptx"]).exists() and (out / row["cubin"]).exists()


def test_ptx_and_cubin_are_for_the_named_arch(built):
    out, index, _ = built
    for row in index["kernels"]:
        ptx = (out / row["ptx"]).read_text()
        want = "sm_87" if row["arch"] == "sm_87" else "sm_90a"  # Triton uses the arch-specific Hopper ISA
        assert f".target {want}" in ptx and row["ptx_target"] == want
        assert f".entry {row['name']}" in ptx
        assert (out / row["cubin"]).read_bytes()[:4] == b"\x7fELF"


def test_prefill_parameters_follow_the_tensorrt_order(built):
    _, index, _ = built
    row = next(r for r in index["kernels"] if r["variant"].startswith("prefill") and r["arch"] == "sm_90")
    params = row["params"]
    assert params[:4] == ["Q", "K", "V", "Window"] and params[-1] == "Out"
    assert "Mask" not in params and row["constexprs"]["Mask"] is None  # no padding input in this variant
    assert row["constexprs"]["CAUSAL"] is True and row["constexprs"]["USE_TMA"] is False


def test_tensorrt_variant_compiles_attributes_in_and_launch_rule():
    from edgeattn.plugins.kernels.aot import prefill_launch
    from edgeattn.plugins.tensorrt.aot import launch_for, variant_for
    from edgeattn.plugins.kernels.aot import compile_variant

    kernel = compile_variant(variant_for("fp16", 64, causal=1, sinks=4, scale=0.0), "sm_87", ptx_version=85)
    assert "sinks" not in kernel.params and "sm_scale" not in kernel.params  # attributes are constants
    assert kernel.constexprs["sinks"] == 4 and kernel.constexprs["sm_scale"] == pytest.approx(0.125)
    assert ".version 8.5" in kernel.ptx
    grid, scalars = launch_for(kernel, (2, 8, 100, 64), (2, 2, 300, 64))
    assert grid == (-(-100 // kernel.constexprs["BLOCK_M"]), 16, 1)
    # q strides, k strides, v strides, out strides, H, GROUP, S_q, S_k
    assert scalars == [8 * 100 * 64, 100 * 64, 64, 2 * 300 * 64, 300 * 64, 64, 2 * 300 * 64, 300 * 64, 64,
                       8 * 100 * 64, 100 * 64, 64, 8, 4, 100, 300]
    assert prefill_launch(kernel, (2, 8, 100, 64), (2, 2, 300, 64)) == (grid, scalars)


def test_bad_arch_is_a_user_error(runner, tmp_path):
    result = runner.invoke(cli, ["kernels", "compile", "--arch", "sm_75", "--out", str(tmp_path / "k")])
    assert result.exit_code == 2 and "sm_87, sm_90, sm_110" in result.output
    assert not (tmp_path / "k").exists()


def test_unmatched_only_is_a_user_error(runner, tmp_path):
    result = runner.invoke(cli, ["kernels", "compile", "--out", str(tmp_path / "k"), "--only", "nothing-*"])
    assert result.exit_code == 2 and "matched none" in result.output


@pytest.mark.skipif(has("tensorrt"), reason="full TensorRT is installed: registration would succeed")
def test_tensorrt_plugin_without_tensorrt_says_how_to_install():
    from edgeattn.errors import MissingDependencyError
    from edgeattn.plugins.tensorrt.aot import register

    with pytest.raises(MissingDependencyError, match="install TensorRT from JetPack"):
        register()


def test_compile_variant_takes_any_arch_name_for_other_launchers():
    from edgeattn.errors import ConfigError
    from edgeattn.plugins.kernels.aot import KernelVariant, compile_variant

    kernel = compile_variant(KernelVariant("decode_reduce", "fp16", 64), "sm_89")  # an RTX (Ada) GPU
    assert ".target sm_89" in kernel.ptx and kernel.arch == "sm_89"
    with pytest.raises(ConfigError, match="sm_87"):
        compile_variant(KernelVariant("decode_reduce", "fp16", 64), "ampere")


@pytest.mark.parametrize("arch", ["sm_87", "sm_90", "sm_110"])
def test_the_cuda_targets_decode_kernels_compile_for_jetson_and_hopper(arch):
    """The ring decode pair the cuda target runs (split kernel + reduce), for Orin, H100/H200 and Thor."""
    from edgeattn.plugins.kernels.aot import KernelVariant, compile_variant

    split = compile_variant(KernelVariant("ring_decode_split", "bf16", 64), arch)
    reduce = compile_variant(KernelVariant("decode_reduce", "bf16", 64), arch)
    for kernel in (split, reduce):
        assert kernel.cubin[:4] == b"\x7fELF" and f".entry {kernel.name}" in kernel.ptx
        assert f".target {arch}" in kernel.ptx  # sm_90a / sm_110a: the arch-specific ISA
    assert split.params[:6] == ["Q", "QS", "K", "V", "Pos", "Window"] and "Out" in split.params
    assert split.constexprs["SPLITS"] > 1 and "_cached_decode_split_kernel" in split.name
