"""`edgeattn eval BUNDLE --task` and `edgeattn eval-table` end to end on the tiny decoder bundle (random weights,
SmolLM2's tokenizer and chat template), opened with a 256-row ring: the scores are ~0, so the tests check the
structure, the prompt sizes, that full attention gives what a window holding the whole context gives, and the
errors."""

from __future__ import annotations

import json

import pytest

from decoder_fixtures import SINKS, requires_decoder_stack
from edgeattn.cli.main import cli

pytestmark = requires_decoder_stack

RING = "256"


def _eval(runner, path, tmp_path, *extra, name="out.json"):
    out = tmp_path / name
    result = runner.invoke(cli, ["eval", str(path), "--task", "passkey", "--context", "200", "--samples", "2",
                                 "--window-max", RING, "--json", str(out), *extra])
    assert result.exit_code == 0, result.output
    return result, json.loads(out.read_text())


def test_eval_prints_accuracy_and_writes_every_sample(tiny_decoder, runner, tmp_path):
    _, _, _, path = tiny_decoder
    result, data = _eval(runner, path, tmp_path)
    assert "passkey at 200 tokens, full (200 rows read of 200; sinks 4, ring 256): accuracy" in result.stdout
    assert "(2 samples" not in result.stdout and "/2 samples, seed 0, 12 new tokens" in result.stdout
    assert data["count"] == 2 and data["setting"] == {"kind": "full", "size": 0} and data["max_tokens"] == 12
    assert data["correct"] == sum(s["correct"] for s in data["samples"])
    for s in data["samples"]:
        assert 200 - 12 - 10 <= s["prompt_tokens"] <= 200 - 12  # the prompt as the bundle tokenizes it
        assert len(s["answers"]) == 1 and len(s["answers"][0]) == 5 and isinstance(s["text"], str)


def test_full_attention_equals_a_window_that_holds_the_context(tiny_decoder, runner, tmp_path):
    _, _, _, path = tiny_decoder
    _, full = _eval(runner, path, tmp_path, name="full.json")
    _, whole = _eval(runner, path, tmp_path, "--window", "200", name="whole.json")
    _, small = _eval(runner, path, tmp_path, "--window", "16", name="small.json")
    assert whole["rows"] == 200 and small["rows"] == SINKS + 16 and small["label"] == "window 16"
    assert [s["text"] for s in whole["samples"]] == [s["text"] for s in full["samples"]]
    assert [s["prompt_tokens"] for s in small["samples"]] == [s["prompt_tokens"] for s in full["samples"]]


def test_eval_table_writes_json_and_plot(tiny_decoder, runner, tmp_path):
    _, _, _, path = tiny_decoder
    out, plot = tmp_path / "results" / "eval.json", tmp_path / "images" / "eval.png"
    result = runner.invoke(cli, ["eval-table", str(path), "--tasks", "passkey,vartrack", "--contexts", "280,320",
                                 "--settings", "full,window", "--divisors", "2", "--samples", "1",
                                 "--window-max", "320", "--out", str(out), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["sinks"] == SINKS and data["window_max"] == 320 and data["config"]["samples"] == 1
    runs = [(r["task"], r["context"], r["label"], r["rows"]) for r in data["results"]]
    assert runs == [(t, c, label, rows) for t in ("passkey", "vartrack") for c in (280, 320)
                    for label, rows in (("full", c), (f"window {c // 2}", SINKS + c // 2))]
    assert all(r["count"] == 1 and 0.0 <= r["accuracy"] <= 1.0 for r in data["results"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.parent.glob(".*")) and not list(plot.parent.glob(".*"))  # no staging files left


def test_eval_table_checks_every_run_before_the_first(tiny_decoder, runner, tmp_path):
    _, _, _, path = tiny_decoder
    out = tmp_path / "eval.json"
    result = runner.invoke(cli, ["eval-table", str(path), "--tasks", "passkey,vartrack", "--contexts", "240",
                                 "--settings", "full", "--window-max", "320", "--out", str(out)])
    assert result.exit_code == 2 and "expected room for the task's instruction" in result.output
    assert "run 1/" not in result.output and not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--task", "needle", "--context", "200"], "task: expected one of passkey, multikey, vartrack, found 'needle'"),
    (["--task", "passkey", "--context", "400"], "context: expected at most the cache's 260 rows (sinks 4 + ring "
                                                "256), found 400: a longer prompt is kept head and tail"),
    (["--task", "passkey", "--context", "600", "--window-max", "1024"],
     "context: expected at most the model's 512 trained positions, found 600"),
    (["--task", "passkey", "--context", "200", "--budget", "10"],
     "attention budget: expected 20 (sinks + one page) to 260 (the cache's rows), found 10"),
    (["--task", "passkey", "--context", "200", "--window", "300"], "window: expected 0 (the whole ring) to 256"),
    (["--task", "passkey", "--context", "200", "--window", "64", "--budget", "64"],
     "expected at most one of --window and --budget"),
    (["--task", "passkey", "--context", "200", "--budget-recent", "0.5"], "--budget-recent applies to --budget N"),
    (["--task", "passkey", "--context", "200", "--prompt-attention", "whole"],
     "--prompt-attention applies to a --window or --budget, found full attention"),
    (["--task", "passkey"], "expected --context TOKENS"),
    (["--task", "passkey", "--context", "40"], "expected room for the task's instruction"),
    (["--model", "smollm2", "--task", "passkey", "--context", "200"], "found both"),
])
def test_bad_input_is_a_clear_error(tiny_decoder, runner, args, message):
    _, _, _, path = tiny_decoder
    extra = [] if "--window-max" in args else ["--window-max", RING]
    result = runner.invoke(cli, ["eval", str(path), *args, *extra, "--samples", "1"])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_the_two_modes_need_their_own_arguments(runner, tiny_onnx):
    result = runner.invoke(cli, ["eval", "--task", "passkey", "--context", "200"])
    assert result.exit_code == 2 and "--task without BUNDLE" in result.output
    result = runner.invoke(cli, ["eval", "--onnx", str(tiny_onnx)])
    assert result.exit_code == 2 and "only one of --model and --onnx" in result.output
    result = runner.invoke(cli, ["eval"])
    assert result.exit_code == 2 and "expected --model and --onnx (fidelity of a quantized ONNX) or BUNDLE --task" \
        in result.output


def test_a_budget_needs_a_bundle_that_reads_pages(tiny_decoder, runner):
    _, _, _, path = tiny_decoder  # exported without a page size
    result = runner.invoke(cli, ["eval", str(path), "--task", "passkey", "--context", "200", "--budget", "64",
                                 "--window-max", RING, "--samples", "1"])
    assert result.exit_code == 2 and "attention budget: expected a decoder bundle whose model reads retrieval " \
                                     "pages" in result.output


def test_prompt_form_raw_is_plain_text_and_chat_is_the_template(tiny_decoder, runner, tmp_path):
    _, _, _, path = tiny_decoder
    _, raw = _eval(runner, path, tmp_path, "--prompt-form", "raw", name="raw.json")
    _, chat = _eval(runner, path, tmp_path, "--prompt-form", "chat", name="chat.json")
    _, default = _eval(runner, path, tmp_path, name="default.json")
    assert raw["prompt_form"] == "raw" == default["prompt_form"] and chat["prompt_form"] == "chat"
    assert [s["answers"] for s in raw["samples"]] == [s["answers"] for s in chat["samples"]]
    for s in raw["samples"]:
        assert 200 - 12 - 10 <= s["prompt_tokens"] <= 200 - 12
    result = runner.invoke(cli, ["eval", str(path), "--task", "passkey", "--context", "200", "--prompt-form", "x"])
    assert result.exit_code == 2 and "'x' is not one of 'raw', 'chat'" in result.output
