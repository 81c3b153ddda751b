"""`edgeattn export --decoder --page N`: the attention budget's page size reaches the decoder export, a page that
does not divide the ring is refused before anything loads, and --page without --decoder is a usage error."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgeattn.cli.main import cli


def test_page_reaches_the_decoder_export(monkeypatch, tmp_path):
    import edgeattn.decoder.export as export

    seen = []
    monkeypatch.setattr(export, "export_decoder", lambda model, out, config, progress=None: seen.append(config) or out)
    result = CliRunner().invoke(cli, ["export", "smollm2", "--decoder", "--quiet", "--page", "16", "--window-max",
                                      "4096", "--dense-layers", "2", "--out", str(tmp_path / "d.onnx")])
    assert result.exit_code == 0, result.output
    assert [(c.page, c.window_max, c.dense_layers) for c in seen] == [(16, 4096, 2)]


def test_a_page_that_does_not_divide_the_ring_is_refused():
    result = CliRunner().invoke(cli, ["export", "smollm2", "--decoder", "--quiet", "--page", "24", "--out", "x.onnx"])
    assert result.exit_code != 0 and "page: expected 0 (no retrieval pages) or a divisor of window_max 2048, found 24" \
        in result.output


@pytest.mark.parametrize("option", [["--page", "16"], ["--dense-layers", "2"]])
def test_page_without_decoder_is_a_usage_error(option):
    result = CliRunner().invoke(cli, ["export", "smollm2", *option, "--out", "x.onnx"])
    assert result.exit_code == 2 and "--page and --dense-layers are for --decoder exports" in result.output
