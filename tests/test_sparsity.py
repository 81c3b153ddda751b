"""2:4 masks on Linear weights: selection, parametrization, gradients, QAT composition, speed rule."""

import json

import numpy as np
import pytest

from onnx_fixtures import requires_torch

pytestmark = [requires_torch, pytest.mark.torch]


def _np_two_four(w: np.ndarray) -> np.ndarray:
    """float64 NumPy reference: keep the 2 largest |w| of every 4 along the last axis."""
    groups = np.abs(w).reshape(w.shape[0], -1, 4)
    order = np.argsort(-groups, axis=-1, kind="stable")[..., :2]
    mask = np.zeros_like(groups, dtype=bool)
    np.put_along_axis(mask, order, True, axis=-1)
    return mask.reshape(w.shape)


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 12),
                               torch.nn.ReLU(), torch.nn.Linear(12 + 0, 6), torch.nn.Linear(6, 3))


def test_mask_keeps_two_largest_of_every_four():
    import torch

    from edgeattn.quantize.sparsity.masks import is_two_four, kept_magnitude, two_four_mask

    w = torch.randn(8, 16, dtype=torch.float64)
    mask = two_four_mask(w)
    assert np.array_equal(mask.numpy(), _np_two_four(w.numpy()))
    assert (mask.reshape(8, 4, 4).sum(-1) == 2).all()
    assert is_two_four(w * mask) and not is_two_four(w)
    ref = (np.abs(w.numpy()) * _np_two_four(w.numpy())).sum() / np.abs(w.numpy()).sum()
    assert kept_magnitude(w) == pytest.approx(ref, rel=1e-9)


def test_sparsify_prunes_eligible_layers_and_reports_skipped():
    from edgeattn.quantize.sparsity.masks import SparsityConfig, is_two_four, masked_layers, sparsify_

    model = _model()
    report = sparsify_(model, SparsityConfig(skip=("4",)))
    assert report.pruned == ["0", "2"]  # K = 16, 32
    skipped = report.as_dict()["skipped"]
    assert skipped["4"] == "skipped by config.skip"
    assert "K = in_features = 6 is not a multiple of 4" in skipped["5"]
    assert set(masked_layers(model)) == {"0", "2"}
    for m in masked_layers(model).values():
        assert is_two_four(m.weight)


def test_masked_entries_get_zero_gradient_and_stay_zero_through_training():
    import torch

    from edgeattn.quantize.sparsity.masks import is_two_four, masked_layers, sparsify_

    model = _model()
    sparsify_(model)
    layer = model[0]
    mask = layer.parametrizations.weight[0].mask
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(5):
        loss = model(torch.randn(4, 16)).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        assert (layer.parametrizations.weight.original.grad[~mask] == 0).all()
        opt.step()
    assert all(is_two_four(m.weight) for m in masked_layers(model).values())


def test_fake_quantized_weights_keep_the_zeros():
    """QAT's fake quantizer reads module.weight: symmetric int8 per-channel keeps zeros, grads stay masked."""
    import torch

    from edgeattn.quantize.sparsity.masks import is_two_four, sparsify_

    model = _model()
    sparsify_(model)
    layer = model[2]
    w = layer.weight  # the masked weight, as every reader sees it
    scale = w.detach().abs().amax(1) / 127
    wq = torch.fake_quantize_per_channel_affine(w, scale, torch.zeros_like(scale, dtype=torch.int32), 0, -127, 127)
    assert is_two_four(wq.detach())
    wq.sum().backward()
    mask = layer.parametrizations.weight[0].mask
    assert (layer.parametrizations.weight.original.grad[~mask] == 0).all()


def test_strip_masks_bakes_the_masked_weight_into_a_copy():
    import torch

    from edgeattn.quantize.sparsity.masks import has_mask, reapply_existing_masks_, sparsify_, strip_masks

    model = _model()
    pruned = sparsify_(model).pruned
    plain = strip_masks(model)
    assert not any(has_mask(m) for m in plain.modules()) and has_mask(model[0])
    assert torch.equal(plain[0].weight, model[0].weight)
    assert isinstance(plain[0].weight, torch.nn.Parameter)
    assert reapply_existing_masks_(plain) == pruned == ["0", "2", "4"]  # a reloaded pruned checkpoint keeps its zeros


def test_tied_embedding_weight_is_not_pruned():
    import torch

    from edgeattn.quantize.sparsity.masks import sparsify_

    emb, head = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10, bias=False)
    head.weight = emb.weight
    report = sparsify_(torch.nn.ModuleDict({"emb": emb, "head": head}))
    assert report.pruned == [] and "tied" in report.as_dict()["skipped"]["head"]


def test_calibrated_pruning_beats_plain_masking_on_correlated_inputs():
    import torch

    from edgeattn.quantize.sparsity.masks import is_two_four, two_four_mask
    from edgeattn.quantize.sparsity.calibrate import prune_two_four

    torch.manual_seed(0)
    x = torch.randn(400, 4) @ torch.randn(4, 32) + 0.1 * torch.randn(400, 32)  # correlated channels
    w = torch.randn(6, 32)
    pruned, mask = prune_two_four(w, (x.T @ x).double())
    assert is_two_four(pruned) and (pruned[~mask] == 0).all() and (mask.reshape(6, 8, 4).sum(-1) == 2).all()
    dense_out = x.double() @ w.double().T  # float64 reference outputs
    err_plain = (x.double() @ (w * two_four_mask(w)).double().T - dense_out).norm()
    err_obs = (x.double() @ pruned.double().T - dense_out).norm()
    assert err_obs < 0.5 * err_plain


def test_permutation_search_raises_kept_magnitude():
    import torch

    from edgeattn.quantize.sparsity.masks import kept_magnitude
    from edgeattn.quantize.sparsity.permute import search_permutation

    w = torch.full((4, 16), 0.01)
    w[:, :4] = 1.0  # all large weights in one group: 2:4 must drop half of them
    perm = search_permutation(w, iters=300)
    assert sorted(perm.tolist()) == list(range(16))
    assert kept_magnitude(w) < 0.55 and kept_magnitude(w[:, perm]) > 0.95


def test_ffn_pair_permutation_preserves_the_function():
    import torch

    from edgeattn.quantize.sparsity.masks import SparsityConfig, sparsify_

    torch.manual_seed(0)
    block = torch.nn.ModuleDict({"intermediate": torch.nn.ModuleDict({"dense": torch.nn.Linear(8, 32)}),
                                 "output": torch.nn.ModuleDict({"dense": torch.nn.Linear(32, 8)})})
    layer = torch.nn.ModuleDict({"layer": block})

    def run(x):
        return block["output"]["dense"](torch.nn.functional.gelu(block["intermediate"]["dense"](x)))

    x = torch.randn(5, 8)
    before = run(x)
    report = sparsify_(layer, SparsityConfig(permute=True, permute_iters=200, skip=("*",)))
    assert report.pruned == []  # skip everything: only the permutation acts
    assert torch.allclose(run(x), before, atol=1e-5)
    entry = {d.name: d for d in report.layers}["layer.output.dense"]
    assert entry.reason == "skipped by config.skip"


def test_speed_table_decides_from_measurements_and_falls_back_to_the_rule(tmp_path):
    from edgeattn.errors import ConfigError
    from edgeattn.quantize.sparsity.speed import RULE_MIN_MACS, load_table

    table = load_table()  # the packaged H200 measurement
    small = table.decide(384, 384, 2048, "fp16")
    assert small.basis == "measured table" and not small.gains and small.speedup < 1
    unknown = table.decide(1000, 1000, 128, "fp16")
    assert unknown.basis == "size rule" and not unknown.gains
    assert table.decide(1000, 1000, 10**6, "int8").gains == (1000 * 1000 * 10**6 >= RULE_MIN_MACS)
    # the benchmark's own JSON, error rows included, is accepted
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"schema": "edgeattn.sparse_speed/1", "device": "NVIDIA H200", "rows": [
        {"M": 512, "N": 64, "K": 64, "dtype": "int8", "dense_ms": 2.0, "sparse_ms": 1.0, "speedup": 2.0, "error": None},
        {"M": 8192, "N": 64, "K": 64, "dtype": "int8", "dense_ms": None, "sparse_ms": None, "speedup": None,
         "error": "RuntimeError: no kernel"}]}))
    mine = load_table(path)
    assert mine.decide(64, 64, 600, "int8").gains  # nearest M is 512
    assert "failed" in mine.decide(64, 64, 8000, "int8").reason
    path.write_text(json.dumps({"schema": "other/2", "rows": []}))
    with pytest.raises(ConfigError, match="expected schema"):
        load_table(path)


def test_speed_policy_prunes_only_where_the_target_gains(tmp_path):
    import torch

    from edgeattn.quantize.sparsity.masks import SparsityConfig, sparsify_

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"rows": [
        {"M": 2048, "N": 32, "K": 16, "dtype": "int8", "speedup": 1.5},
        {"M": 2048, "N": 12, "K": 32, "dtype": "int8", "speedup": 0.2}]}))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 12), torch.nn.Linear(12, 8))
    report = sparsify_(model, SparsityConfig(policy="speed", speed_table=str(path)))
    by = {d.name: d for d in report.layers}
    assert report.pruned == ["0"] and by["0"].basis == "measured table" and by["0"].speedup == 1.5
    assert "loses" in by["1"].reason
    assert by["2"].basis == "size rule"


def test_config_validation():
    from edgeattn.errors import ConfigError
    from edgeattn.quantize.sparsity.masks import SparsityConfig

    with pytest.raises(ConfigError, match="policy"):
        SparsityConfig(policy="some")
    with pytest.raises(ConfigError, match="speed_table"):
        SparsityConfig(speed_table="/nonexistent.json")
    with pytest.raises(ConfigError, match="calibration"):
        from edgeattn.quantize.sparsity.masks import sparsify_

        sparsify_(_model(), SparsityConfig(method="calibrated"))


def test_time_budget_runs_until_the_budget_even_when_steps_speed_up(monkeypatch):
    """A clock that ticks once per batch: 2 s a step for 30 steps (a busy GPU), then 0.5 s. The run must last its
    100 s budget (60 s + 80 steps), not stop at the 50 steps that the first 30 step times predict."""
    import dataclasses
    import types

    from edgeattn.quantize import distillation as ft
    from edgeattn.quantize.sparsity.masks import sparsify_
    from tests.quant_models import tiny_llama, token_batch

    clock = [0.0]
    monkeypatch.setattr(ft, "time", types.SimpleNamespace(time=lambda: clock[0]))

    def batches():
        n = 0
        while True:
            clock[0] += 2.0 if n < 30 else 0.5
            n += 1
            yield token_batch(2, 8, seed=n)

    teacher = tiny_llama()
    student = tiny_llama()
    sparsify_(student)
    config = ft.sparsity_finetune("decoder", steps=1000, time_budget_s=100.0)
    out = ft.distill(student, teacher, batches(), "decoder", config)
    assert out.steps_run == 110
    out = ft.distill(student, teacher, batches(), "decoder", dataclasses.replace(config, steps=7))
    assert out.steps_run == 7  # the step count still caps a run that has time left


def test_learning_rate_warms_up_then_decays_to_zero_by_progress():
    from edgeattn.quantize.distillation import DistillConfig, fraction_done, lr_factor

    assert lr_factor(0, 0.0) == pytest.approx(0.1) and lr_factor(9, 0.0) == 1.0
    assert lr_factor(500, 0.75) == pytest.approx(0.25) and lr_factor(500, 1.0) == 0.0
    config = DistillConfig(steps=100, time_budget_s=10.0)
    assert fraction_done(config, 20, 5.0) == 0.5  # time is further along than steps (0.2)
    assert fraction_done(config, 80, 5.0) == 0.8  # steps are further along than time
    assert fraction_done(DistillConfig(steps=100), 20, 1e9) == 0.2  # no budget: steps only


def _calib(n=3, seq=10, vocab=1000):
    from tests.quant_models import token_batch

    return [token_batch(4, seq, seed=s, vocab=vocab) for s in range(n)]


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_sequential_pruning_walks_blocks_and_stages(arch):
    """Stages follow the shared inputs (q/k/v, then o, gate/up, down); block 0 sees the dense inputs, so its
    first stage matches one-shot calibration exactly, and later blocks differ (pruned inputs)."""
    import copy

    import torch

    from edgeattn.quantize.sparsity.masks import SparsityConfig, is_two_four, masked_layers, sparsify_
    from edgeattn.quantize.sparsity.sequential import _capture_block_inputs, _stages, find_blocks
    from tests.quant_models import tiny_bert, tiny_llama

    dense = tiny_llama() if arch == "llama" else tiny_bert()
    calib = _calib(vocab=dense.config.vocab_size)
    linears = {n: m for n, m in dense.named_modules() if isinstance(m, torch.nn.Linear)}  # lm_head: after the blocks
    blocks = find_blocks(dense, linears)
    assert len(blocks) == dense.config.num_hidden_layers
    block0 = {n: m for n, m in linears.items() if any(m is x for x in blocks[0].modules())}
    stages = [[n.split(".")[-1] if arch == "llama" else ".".join(n.split(".")[-2:]) for n in s]
              for s in _stages(blocks[0], block0, _capture_block_inputs(dense, blocks[0], calib))]
    expected = ([["q_proj", "k_proj", "v_proj"], ["o_proj"], ["gate_proj", "up_proj"], ["down_proj"]]
                if arch == "llama" else
                [["self.query", "self.key", "self.value"], ["output.dense"], ["intermediate.dense"], ["output.dense"]])
    assert stages == expected
    one, seq = copy.deepcopy(dense), copy.deepcopy(dense)
    sparsify_(one, SparsityConfig(method="calibrated"), calibration=calib)
    sparsify_(seq, SparsityConfig(method="sequential"), calibration=calib)
    m_one, m_seq = masked_layers(one), masked_layers(seq)
    assert set(m_one) == set(m_seq) and len(m_seq) == len(linears)
    assert all(is_two_four(m.weight) for m in m_seq.values())
    first = next(n for n in m_seq if n in block0)  # q_proj / query of block 0: same inputs, same result
    torch.testing.assert_close(m_seq[first].weight, m_one[first].weight, rtol=0, atol=1e-6)
    last = [n for n in m_seq if n not in block0][-1]
    assert not torch.allclose(m_seq[last].weight, m_one[last].weight)


def test_sequential_pruning_needs_blocks():
    import torch

    from edgeattn.errors import ModelError
    from edgeattn.quantize.sparsity.masks import SparsityConfig, sparsify_

    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    with pytest.raises(ModelError, match="ModuleList of transformer blocks"):
        sparsify_(model, SparsityConfig(method="sequential"), calibration=[{"input": torch.ones(2, 8)}])


def test_encoder_batches_equal_the_tokenizers_own_padding(tmp_path):
    """Sentences are tokenized once and padded per batch: the same tensors as tokenizing each batch."""
    import torch
    import transformers

    from edgeattn.text import stream_batches
    from tests.quant_models import save_tiny_bert

    tok = transformers.AutoTokenizer.from_pretrained(str(save_tiny_bert(tmp_path / "bert")))
    docs = ["the w1 w2 of w3. a w4 is w5 w6 w7 w8 w9 the w10. it was w11", "w12 w13 w14 to and in. w15 w16 w17 w18 w19"]
    config = dict(batch_size=3, seq_len=8, seed=5, length_grouping=1)
    sentences = ["the w1 w2 of w3.", "a w4 is w5 w6 w7 w8 w9 the w10.", "it was w11.", "w12 w13 w14 to and in.",
                 "w15 w16 w17 w18 w19."]
    gen = torch.Generator().manual_seed(5)
    batches = stream_batches(tok, docs, "encoder", **config)
    for _ in range(4):
        pick = torch.randint(0, len(sentences), (3,), generator=gen).tolist()
        ref = tok([sentences[i] for i in pick], padding=True, truncation=True, max_length=8, return_tensors="pt")
        got = next(batches)
        assert set(got) == set(ref)
        for key in ref:
            assert torch.equal(got[key], ref[key]), key


def test_encoder_batches_grouped_by_length_cover_the_pool_with_less_padding(tmp_path):
    """With length grouping, a pool of 4 batches is the random draw sorted by length and cut in 4, served in
    random order: the first pool holds the same sentences as the ungrouped first draw, with far less padding."""
    import torch
    import transformers

    from edgeattn.text import stream_batches
    from tests.quant_models import save_tiny_bert

    tok = transformers.AutoTokenizer.from_pretrained(str(save_tiny_bert(tmp_path / "bert")))
    words = ["w%d" % i for i in range(1, 40)]
    docs = [". ".join(" ".join(words[:n]) for n in (3, 5, 8, 13, 21, 34)) * 3]
    grouped = stream_batches(tok, docs, "encoder", batch_size=4, seq_len=64, seed=3, length_grouping=4)
    plain = stream_batches(tok, docs, "encoder", batch_size=16, seq_len=64, seed=3, length_grouping=1)
    for k in range(3):
        pool = next(plain)  # 16 draws padded together; the first equals the grouped pool's draws (same seed)
        parts = [next(grouped) for _ in range(4)]
        lengths = sorted(int(n) for p in parts for n in p["attention_mask"].sum(1))
        assert k > 0 or lengths == sorted(int(n) for n in pool["attention_mask"].sum(1))
        assert len(lengths) == 16
        spans = sorted((int(p["attention_mask"].sum(1).min()), int(p["attention_mask"].sum(1).max())) for p in parts)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # sorted, then cut: the ranges do not overlap
        padded = sum(p["input_ids"].numel() for p in parts)
        assert padded < 0.8 * pool["input_ids"].numel()
        for p in parts:  # the rows are real tokenizations, padded with zeros after their mask
            assert torch.equal(p["input_ids"] * (1 - p["attention_mask"]), torch.zeros_like(p["input_ids"]))
