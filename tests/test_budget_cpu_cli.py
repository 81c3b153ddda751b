"""`edgeattn export --decoder --page N`: the attention budget's page size reaches the decoder export, a page that
does not divide the ring is refused before anything loads, and --page without --decoder is a usage error."""

from __future__ import annotations

from click.testing import CliRunner

from edgeattn.cli.main import cli


def test_page_reaches_the_decoder_export(monkeypatch, tmp_path):
    import edgeattn.decoder.export as export

    seen = []
    monkeypatch.setattr(export, "export_decoder", lambda model, out, config, progress=None: seen.append(config) or out)
    result = CliRunner().invoke(cli, ["export", "smollm2", "--decoder", "--quiet", "--page", "16", "--window-max",
                                      "4096", "--out", str(tmp_path / "d.onnx")])
    assert result.exit_code == 0, result.output
    assert [(c.page, c.window_max) for c in seen] == [(16, 4096)]


def test_a_page_that_does_not_divide_the_ring_is_refused():
    result = CliRunner().invoke(cli, ["export", "smollm2", "--decoder", "--quiet", "--page", "24", "--out", "x.onnx"])
    assert result.exit_code != 0 and "page: expected 0 (no retrieval pages) or a divisor of window_max 2048, found 24" \
        in result.output


def test_page_without_decoder_is_a_usage_error():
    result = CliRunner().invoke(cli, ["export", "smollm2", "--page", "16", "--out", "x.onnx"])
    assert result.exit_code == 2 and "--page is for --decoder exports" in result.output
