"""`edgeattn eval BUNDLE --task --budget N` on a tiny decoder exported with retrieval pages (page 16): the run
reads a window and pages, reports the rows, and a budget holding every row gives what full attention gives."""

from __future__ import annotations

import json

import pytest

from decoder_fixtures import SINKS, requires_decoder_stack
from edgeattn.cli.main import cli

pytestmark = [requires_decoder_stack, pytest.mark.slow]


def _eval(runner, path, out, *extra):
    result = runner.invoke(cli, ["eval", str(path), "--task", "passkey", "--context", "200", "--samples", "2",
                                 "--window-max", "256", "--json", str(out), *extra])
    assert result.exit_code == 0, result.output
    return result, json.loads(out.read_text())


def test_a_budget_runs_and_a_whole_budget_equals_full_attention(tiny_paged_decoder, runner, tmp_path):
    _, full = _eval(runner, tiny_paged_decoder, tmp_path / "full.json")
    result, whole = _eval(runner, tiny_paged_decoder, tmp_path / "whole.json", "--budget", "260")
    assert "budget 260 (25% recent) (200 rows read of 200" in result.stdout
    assert whole["setting"] == {"kind": "budget", "size": 260, "recent": 0.25} and whole["rows"] == 200
    assert [s["text"] for s in whole["samples"]] == [s["text"] for s in full["samples"]]
    _, small = _eval(runner, tiny_paged_decoder, tmp_path / "small.json", "--budget", "68", "--budget-recent", "0.5")
    assert small["rows"] == 68 and small["label"] == "budget 68 (50% recent)" and small["count"] == 2


def test_a_whole_prompt_says_so_in_the_label_and_the_json(tiny_paged_decoder, runner, tmp_path):
    """--prompt-attention whole: the label and the JSON say it, and with a budget holding every row it is full
    attention."""
    _, full = _eval(runner, tiny_paged_decoder, tmp_path / "full.json")
    result, whole = _eval(runner, tiny_paged_decoder, tmp_path / "whole.json", "--budget", "260", "--prompt-attention",
                          "whole")
    assert "budget 260 (25% recent, prompt whole)" in result.stdout
    assert whole["setting"] == {"kind": "budget", "size": 260, "recent": 0.25, "prompt": "whole"}
    assert [s["text"] for s in whole["samples"]] == [s["text"] for s in full["samples"]]
    _, small = _eval(runner, tiny_paged_decoder, tmp_path / "small.json", "--window", "16", "--prompt-attention", "whole")
    assert small["label"] == "window 16 (prompt whole)" and small["rows"] == SINKS + 16


@pytest.fixture(scope="module")
def page8_decoder(tmp_path_factory):
    """The tiny decoder exported with pages of 8 rows (a page size other than the default 16)."""
    from decoder_fixtures import paged_decoder

    return paged_decoder(tmp_path_factory.mktemp("page8_decoder"), 8)


def test_a_budget_takes_the_bundles_page_size(page8_decoder, runner, tmp_path):
    """A budget of N rows on a bundle with pages of 8 is split into pages of 8 (44 rows: sinks 4 + W 8 + 4 pages),
    in `eval` and in `generate`; pages of 16 were refused by the model ("expected pages of 8 rows")."""
    result, small = _eval(runner, page8_decoder, tmp_path / "small.json", "--budget", "44")
    assert small["rows"] == 44 and small["label"] == "budget 44 (25% recent)", result.output
    result = runner.invoke(cli, ["generate", str(page8_decoder), "--prompt", "the sky is", "--budget", "44",
                                 "--max-tokens", "3"])
    assert result.exit_code == 0, result.output
