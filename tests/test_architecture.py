"""The dependency direction between sub-packages (import-linter contracts in pyproject.toml), and no private
imports across packages.

quantize/, runtime/ and plugins/ install as edgeattn.quantize, edgeattn.runtime and edgeattn.plugins, so
the linter reads a copy of the source laid out as the installed package is."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"quantize": "quantize", "runtime": "runtime", "plugins": "plugins"}

pytest.importorskip("importlinter", reason="needs import-linter (pip install 'edgeattn[dev]')")


def _installed_layout(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "edgeattn", dest / "edgeattn", ignore=ignore)
    for sub, folder in FOLDERS.items():
        shutil.copytree(ROOT / folder, dest / "edgeattn" / sub, ignore=ignore)
    return dest


def _lint(tree: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).with_name("lint-imports")
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "NO_COLOR": "1"}
    return subprocess.run([str(lint), str(ROOT / "pyproject.toml")], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return _installed_layout(tmp_path_factory.mktemp("layout"))


def test_contracts_are_kept(tree):
    result = _lint(tree)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_a_backward_import_breaks_a_contract(tree, tmp_path):
    """The check can fail: an engine that imports the server is reported."""
    broken = _installed_layout(tmp_path / "broken")
    (broken / "edgeattn" / "engines" / "reaches_up.py").write_text("import edgeattn.runtime.server.app\n")
    result = _lint(broken)
    assert result.returncode != 0 and "edgeattn.engines.reaches_up -> edgeattn.runtime.server.app" in result.stdout


def _package_of(module: str, is_package: bool) -> str:
    return module if is_package else module.rpartition(".")[0]


def private_cross_package_imports(tree: Path) -> list[str]:
    found = []
    for path in sorted((tree / "edgeattn").rglob("*.py")):
        rel = path.relative_to(tree).with_suffix("")
        is_pkg = rel.name == "__init__"
        module = ".".join(rel.parts[:-1] if is_pkg else rel.parts)
        here = _package_of(module, is_pkg)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("edgeattn"):
                target_pkg = node.module if (tree / Path(*node.module.split("."))).is_dir() else \
                    node.module.rpartition(".")[0]
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__") and target_pkg != here:
                        found.append(f"{module}: from {node.module} import {alias.name}")
    return found


def test_no_private_imports_across_packages(tree):
    assert private_cross_package_imports(tree) == []


def test_the_private_import_check_can_fail(tmp_path):
    broken = _installed_layout(tmp_path / "broken")
    (broken / "edgeattn" / "cli" / "peeks.py").write_text("from edgeattn.bundle.build import _parity\n")
    assert "edgeattn.cli.peeks: from edgeattn.bundle.build import _parity" in private_cross_package_imports(broken)
