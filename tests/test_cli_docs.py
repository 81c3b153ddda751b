"""docs/cli.md is generated from --help and must not go stale."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_cli_page_is_current():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", REPO / "scripts" / "gen_cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (REPO / "docs" / "cli.md").read_text() == module.render(), \
        "docs/cli.md is stale: run python scripts/gen_cli_docs.py"
