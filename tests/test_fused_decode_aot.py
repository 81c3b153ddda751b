"""The fused decode step's kernels (plugins/kernels/fused_decode.py) build ahead of time, with no GPU, for Orin
(sm_87), Hopper (sm_90) and Thor (sm_110), and `edgeattn kernels compile` lists them."""

from __future__ import annotations

import json

import pytest

from onnx_fixtures import has

pytestmark = [pytest.mark.triton, pytest.mark.skipif(not has("triton"), reason="needs triton")]


def test_every_fused_kernel_is_a_default_variant():
    from edgeattn.plugins.kernels.aot import FUSED_KINDS, default_variants
    from edgeattn.plugins.kernels.fused_decode import AOT_KINDS

    assert FUSED_KINDS == AOT_KINDS
    names = {v.name for v in default_variants()}
    for dtype in ("bf16", "fp16"):
        for kind in AOT_KINDS:
            assert any(n.startswith(f"{kind}-{dtype}-d64-k") for n in names), kind
    assert "fused_linear_residual-bf16-d64-k1536" in names  # the down projection reduces over the MLP's width


def test_a_fused_variant_needs_its_reduction_size():
    from edgeattn.errors import ConfigError
    from edgeattn.plugins.kernels.aot import KernelVariant

    with pytest.raises(ConfigError, match="features"):
        KernelVariant("fused_gate_up", "bf16", 64)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_87", "sm_90", "sm_110"])
def test_fused_kernels_compile_for_each_arch(arch):
    from edgeattn.plugins.kernels.aot import FUSED_KINDS, compile_variant, default_variants

    want = "sm_90a" if arch == "sm_90" else "sm_110a" if arch == "sm_110" else arch
    variants = [v for v in default_variants() if v.kind in FUSED_KINDS and v.dtype == "bf16"]
    assert len(variants) == 7
    for v in variants:
        kernel = compile_variant(v, arch)
        assert f".entry {kernel.name}" in kernel.ptx and kernel.cubin[:4] == b"\x7fELF"
        target = next(line for line in kernel.ptx.splitlines() if line.startswith(".target"))
        assert target.split()[1].rstrip(",") in (arch, want), (v.name, target)
        assert kernel.constexprs.get("K", v.features) == v.features  # the reduction size is compiled in
        if v.kind.endswith("qkv_rope"):  # pointers first, then sizes: the launcher's order
            assert kernel.params[:4] == ["X", "Ids", "Hout", "LnW"] and kernel.params[-2:] == ["eps", "rope_scale"]
            assert kernel.constexprs["FROM_IDS"] is (v.kind == "fused_embed_qkv_rope")


def test_kernels_compile_lists_the_fused_kernels(tmp_path):
    from click.testing import CliRunner

    from edgeattn.cli.main import cli

    out = tmp_path / "k"
    result = CliRunner().invoke(cli, ["kernels", "compile", "--arch", "sm_90", "--out", str(out),
                                      "--only", "fused_argmax-bf16-*"])
    assert result.exit_code == 0, result.output
    assert "fused_argmax-bf16-d64-k49152" in result.output
    index = json.loads((out / "index.json").read_text())
    row = index["kernels"][0]
    assert row["variant"] == "fused_argmax-bf16-d64-k49152" and row["params"] == ["PartV", "PartI", "Out", "n_blocks"]
    assert row["grid"] == "(B, 1, 1)"
