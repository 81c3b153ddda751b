"""The fused decode step (plugins/kernels/fused_decode.py, DecodeGraph(compile="fused")): each kernel against the
eager step's pieces and the whole step against decode_logits, on CPU under TRITON_INTERPRET=1 (its own process,
tests/fused_decode_cases.py), float32; marked gpu, the step captured in a CUDA graph against the eager step."""

from __future__ import annotations

import pytest

import interpreter_runs
from onnx_fixtures import has

needs_stack = pytest.mark.skipif(not (has("triton") and has("torch") and has("transformers")),
                                 reason="needs triton, torch and transformers")


@pytest.fixture(scope="module")
def fused_errors() -> dict[str, float]:
    return interpreter_runs.result("fused_errors")


@pytest.mark.triton
@pytest.mark.slow
@needs_stack
def test_each_fused_kernel_matches_the_eager_pieces(fused_errors):
    pieces = {k: v for k, v in fused_errors.items() if k.split(":")[0] in ("head", "tail", "lm_head")}
    for tiles in ("gemv", "dot"):  # one stream a program, and tl.dot tiles of streams
        for family in ("llama", "qwen2", "qwen3"):  # plain, with Q/K/V biases, with per-head norms
            for name in ("q", "q_sink", "k_row", "v_row", "other_rows_untouched"):
                for layer in (0, 1):  # from the embedding table, and from h
                    assert f"head:{family}:{tiles}:layer{layer}:{name}" in pieces
        assert f"head:llama:{tiles}:layer0:h_from_ids" in pieces and f"tail:llama:{tiles}:h" in pieces
    bad = {k: v for k, v in pieces.items() if "argmax_wrong" not in k and not v <= 1e-5}
    assert not bad, f"relative error above 1e-5 (float32): {bad}"
    assert not {k: v for k, v in pieces.items() if k.endswith("argmax_wrong") and v}


@pytest.mark.triton
@pytest.mark.slow
@needs_stack
def test_the_fused_step_matches_decode_logits_through_a_wrapping_ring(fused_errors):
    steps = {k: v for k, v in fused_errors.items() if k.startswith(("step:", "graph:"))}
    assert {"step:qwen3:logits", "step:qwen3:cache", "graph:greedy_wrong"} <= set(steps)
    assert all(v <= 1e-5 for k, v in steps.items() if not k.endswith("wrong")), steps
    assert all(v == 0 for k, v in steps.items() if k.endswith("wrong")), steps


@needs_stack
def test_auto_takes_the_fused_step_for_small_batches_only():
    torch = pytest.importorskip("torch")
    import transformers

    from edgeattn.plugins.kernels import fused_decode as fk
    from edgeattn.runtime.cuda.decode_step import FUSED_MAX_BATCH, GEMV_MAX_BATCH, DecodeGraph, PackedDecoder

    assert GEMV_MAX_BATCH == fk.GEMV_MAX_BATCH  # the host's copy of the kernels' bucket

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    weights = PackedDecoder.from_hf(transformers.LlamaForCausalLM(config).eval(), sinks=2, window_max=8)
    keys, values = weights.new_cache(FUSED_MAX_BATCH + 1)
    small = DecodeGraph(weights, keys, values, batch=FUSED_MAX_BATCH, compile="auto")
    large = DecodeGraph(weights, keys, values, batch=FUSED_MAX_BATCH + 1, compile="auto")
    assert (small.compile, large.compile) == ("fused", "linked")
    narrow = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=1, head_dim=16)
    w16 = PackedDecoder.from_hf(transformers.LlamaForCausalLM(narrow).eval(), sinks=2, window_max=8)
    k16, v16 = w16.new_cache(GEMV_MAX_BATCH + 1)
    assert DecodeGraph(w16, k16, v16, batch=GEMV_MAX_BATCH, compile="auto").compile == "fused"
    assert DecodeGraph(w16, k16, v16, batch=GEMV_MAX_BATCH + 1, compile="auto").compile == "linked"  # tl.dot tiles
    with pytest.raises(ValueError, match="compile: expected one of"):
        DecodeGraph(weights, keys, values, batch=1, compile="fast")
    assert torch.is_tensor(small.window)


@pytest.mark.gpu
@needs_stack
@pytest.mark.parametrize("dtype,batch", [("float32", 3), ("bfloat16", 3), ("float32", 40), ("bfloat16", 40)])
def test_fused_graph_replays_equal_eager_steps_on_cuda(dtype, batch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import transformers

    from edgeattn.runtime.cuda.decode_step import DecodeGraph, PackedDecoder, decode_logits

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=384, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5)
    model = transformers.LlamaForCausalLM(config).to("cuda", getattr(torch, dtype)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharp logits: greedy choices are not near-ties
    weights = PackedDecoder.from_hf(model, sinks=4, window_max=32)
    tokens = torch.randint(0, 512, (batch, 50), device="cuda")
    k1, v1 = weights.new_cache(batch)
    k2, v2 = weights.new_cache(batch)
    k3, v3 = weights.new_cache(batch)
    greedy = DecodeGraph(weights, k2, v2, batch=batch, compile="fused")  # 40: tl.dot tiles, 3: one stream a program
    logits = DecodeGraph(weights, k3, v3, batch=batch, compile="fused", greedy=False)
    offsets = torch.arange(batch, device="cuda") * 5 % 23 - 9  # streams at their own positions
    worst, near_ties, wrong = 0.0, 0, 0
    with torch.no_grad():
        for p in range(50):  # the ring of 32 wraps; window 16 < ring
            pos = (p + offsets).clamp(min=0)
            want = decode_logits(weights, tokens[:, p], pos, torch.tensor(16, device="cuda"), k1, v1).float()
            ids = greedy(tokens[:, p], pos, 16)
            got = logits(tokens[:, p], pos, 16).float()
            diff = float((got - want).abs().max())
            worst = max(worst, diff / float(want.abs().max()))
            # bf16 rounds in other places than the eager step: a different choice must be a near-tie of the eager
            # logits (within twice the largest logit difference), never a clearly worse token
            chosen = want.gather(1, ids[:, None])[:, 0]
            off = chosen < want.max(-1).values
            near_ties += int(off.sum())
            wrong += int((off & (chosen < want.max(-1).values - 2 * diff)).sum())
    assert wrong == 0
    if dtype == "float32":
        assert near_ties == 0 and worst < 1e-3, (near_ties, worst)
    else:
        assert near_ties <= max(5, batch * 50 // 100) and worst < 3e-2, (near_ties, worst)  # 1% of the choices


@pytest.mark.gpu
@needs_stack
def test_dependent_launch_changes_no_bit_of_the_step_on_cuda(monkeypatch):
    """The fused step launched as programmatic dependents (Hopper and newer), its split attention merged by the last
    split program, against the same step launched plainly (EDGEATTN_PDL=0) with the reduce kernel
    (EDGEATTN_SPLIT_MERGE=kernel): the same arithmetic, so every logit is bit for bit the same; a kernel that read
    its input before the one writing it had finished, or a merge before every split had stored, would differ."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a CUDA GPU of compute capability 9.0 or newer (programmatic dependent launch)")
    import transformers

    from edgeattn.plugins.kernels.dependent_launch import dependent_launch
    from edgeattn.runtime.cuda.decode_step import DecodeGraph, PackedDecoder

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    weights = PackedDecoder.from_hf(model, sinks=4, window_max=512)
    tokens = torch.randint(0, 4096, (4, 40), device="cuda")
    k1, v1 = weights.new_cache(4)
    k2, v2 = weights.new_cache(4)
    for t in (k1, v1):
        for c in t:
            c.normal_()
    for a, b in zip(k1 + v1, k2 + v2):
        b.copy_(a)
    assert dependent_launch(torch.device("cuda"))
    with_pdl = DecodeGraph(weights, k1, v1, batch=4, compile="fused", greedy=False)
    monkeypatch.setenv("EDGEATTN_PDL", "0")
    monkeypatch.setenv("EDGEATTN_SPLIT_MERGE", "kernel")
    assert not dependent_launch(torch.device("cuda"))
    plain = DecodeGraph(weights, k2, v2, batch=4, compile="fused", greedy=False)
    plain(tokens[:, 0], torch.tensor([600, 7, 300, 1], device="cuda"), 0)  # captured without the attribute
    monkeypatch.delenv("EDGEATTN_PDL")
    monkeypatch.delenv("EDGEATTN_SPLIT_MERGE")
    with torch.no_grad():
        for p in range(40):
            pos = torch.tensor([600 + p, 7 + p, 300 + p, 1 + p], device="cuda")
            for window in (0, 128):
                a = with_pdl(tokens[:, p], pos, window).clone()
                b = plain(tokens[:, p], pos, window).clone()
                assert torch.equal(a, b), (p, window, float((a.float() - b.float()).abs().max()))
    for a, b in zip(k1 + v1, k2 + v2):
        assert torch.equal(a, b)


@pytest.mark.triton
def test_dependent_launch_fetches_weights_before_it_waits_and_only_on_hopper():
    """sm_90 builds of each fused kernel with USE_PDL: the weight prefetch comes before the wait for the kernel
    before; the ahead-of-time builds (plain launches, also for Orin's sm_87) hold no grid-dependency instruction;
    the host turns it off for CPU tensors and with EDGEATTN_PDL=0."""
    torch = pytest.importorskip("torch")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile as triton_compile

    from edgeattn.plugins.kernels import fused_decode as fk
    from edgeattn.plugins.kernels.dependent_launch import dependent_launch

    for kind in fk.AOT_KINDS:
        fn, const, warps, _, _, types = fk.aot_kernel(kind, "*bf16", 64, 576)
        assert const["USE_PDL"] is False
        for use_pdl, arch in ((False, 87), (True, 90)):
            c = dict(const, USE_PDL=use_pdl)
            if "PF_LINES" in c:
                c["PF_LINES"] = 128
            sig = {n: ("constexpr" if n in c else types[n]) for n in fn.arg_names}
            ptx = triton_compile(ASTSource(fn, sig, c), target=GPUTarget("cuda", arch, 32),
                                 options={"num_warps": warps}).asm["ptx"]
            wait = ptx.find("griddepcontrol.wait")
            if not use_pdl:
                assert wait < 0 and "prefetch.global.L2" not in ptx, kind
                continue
            assert 0 <= wait < ptx.find("griddepcontrol.launch_dependents"), kind
            if kind != "fused_argmax":  # the argmax reads no weights
                assert 0 <= ptx.find("prefetch.global.L2") < wait, kind
    assert not dependent_launch(torch.device("cpu"))
