"""Long work tells how far it is: pruning layer by layer, fine-tuning and QAT step by step (StepProgress, with
a time estimate), drawn as a bar on a terminal, a line now and then elsewhere, nothing with --quiet."""

from __future__ import annotations

import copy
import io

import pytest

from edgeattn.cli.progress_display import ProgressDisplay
from edgeattn.quantize.progress import StepProgress, clock


def _console(terminal: bool):
    from rich.console import Console

    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=120), buf


def test_step_progress_estimates_the_time_left():
    p = StepProgress("fine-tuning", 30, 150, 60.0, loss=0.25)
    assert p.eta_s == pytest.approx(240.0)
    assert str(p) == "fine-tuning: step 30/150 (20%), 1:00 elapsed, about 4:00 left, loss 0.25"
    assert str(StepProgress("QAT", 100, 100, 3725.0)) == "QAT: step 100/100 (100%), 1:02:05 elapsed, done"
    assert StepProgress("QAT", 0, 100, 0.0).eta_s is None
    budget = StepProgress("fine-tuning", 10, 1000, 30.0, fraction=0.5)  # a time budget half spent
    assert budget.share == 0.5 and budget.eta_s == pytest.approx(30.0)
    assert clock(59.6) == "1:00"


def test_plain_output_prints_a_line_now_and_then_and_at_the_end():
    console, buf = _console(terminal=False)
    now = [0.0]
    with ProgressDisplay(console=console, line_every_s=30.0, clock=lambda: now[0]) as show:
        show("pruning (all, calibrated) on cpu")
        for step in range(1, 151):
            now[0] = step * 1.0  # one step a second
            show(StepProgress("fine-tuning", step, 150, now[0]))
    lines = buf.getvalue().splitlines()
    assert lines[0] == "pruning (all, calibrated) on cpu"
    steps = [line.split()[2] for line in lines[1:]]
    assert steps == ["1/150", "31/150", "61/150", "91/150", "121/150", "150/150"]
    assert "left" in lines[2] and lines[-1].endswith("done")


def test_quiet_prints_nothing():
    console, buf = _console(terminal=True)
    with ProgressDisplay(console=console, quiet=True) as show:
        show("exporting m.onnx")
        show(StepProgress("QAT", 5, 10, 2.0))
    assert buf.getvalue() == ""


def test_a_terminal_gets_a_bar_with_steps_and_time_left():
    console, buf = _console(terminal=True)
    with ProgressDisplay(console=console) as show:
        show(StepProgress("QAT", 25, 100, 50.0, loss=0.5))
    out = buf.getvalue()
    assert "QAT" in out and "25/100" in out and "2:30 left" in out and "loss 0.5" in out


@pytest.mark.torch
def test_pruning_fine_tuning_and_qat_report_every_step():
    pytest.importorskip("transformers")
    from edgeattn.quantize import DistillConfig, distill
    from edgeattn.quantize.sparsity.masks import SparsityConfig, sparsify_
    from edgeattn.text import sampled_batches
    from quant_models import tiny_bert, token_batch

    seen = []
    model = tiny_bert()
    report = sparsify_(model, SparsityConfig(method="magnitude"), progress=seen.append)
    pruning = [m for m in seen if isinstance(m, StepProgress)]
    assert [(m.task, m.done, m.total) for m in pruning] == [("pruning", i, len(report.pruned))
                                                             for i in range(1, len(report.pruned) + 1)]

    seen.clear()
    teacher = copy.deepcopy(model)
    distill(model, teacher, sampled_batches(token_batch(8, 12), 8), "encoder",
            DistillConfig(steps=3, progress=False), log=seen.append, task="fine-tuning")
    steps = [m for m in seen if isinstance(m, StepProgress)]
    assert [(m.task, m.done, m.total) for m in steps] == [("fine-tuning", i, 3) for i in (1, 2, 3)]
    assert all(m.loss is not None for m in steps) and steps[-1].finished


@pytest.mark.torch
def test_qat_after_sparsity_reports_its_steps(tmp_path):
    pytest.importorskip("transformers")
    import transformers

    from edgeattn.quantize.sparsity.masks import SparsityConfig, sparsify_
    from edgeattn.quantize.sparsity.qat import qat_after_sparsity
    from quant_models import save_tiny_bert

    folder = tmp_path / "bert"
    save_tiny_bert(folder)
    model = transformers.AutoModel.from_pretrained(str(folder)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    sparsify_(model, SparsityConfig(method="magnitude"))
    teacher = copy.deepcopy(model)
    seen = []
    qat_after_sparsity(model, teacher, tok, "encoder", ["the a of to and in w1 w2 w3"] * 8, 2, batch_size=4,
                       seq_len=8, calib_batches=1, progress=seen.append)
    steps = [(m.task, m.done, m.total) for m in seen if isinstance(m, StepProgress)]
    assert steps == [("QAT", 1, 2), ("QAT", 2, 2)]
