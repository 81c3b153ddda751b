#!/usr/bin/env bash
# The import contracts of pyproject.toml ([tool.importlinter]) on the package laid out as it installs
# (quantize/, runtime/, plugins/ become edgeattn.quantize, .runtime, .plugins): every module in a layer,
# no layer importing a higher one, no cycles between sibling packages. Exits non-zero on a broken contract.
# Runs with .venv/bin/python, or the interpreter in $PYTHON (it needs import-linter: pip install 'edgeattn[dev]').
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" scripts/lint_imports.py
