"""The dependency direction between sub-packages (import-linter contracts in pyproject.toml): every module in a
layer, no import up a layer, no cycles between siblings, and no private imports across packages.

quantize/, runtime/ and plugins/ install as edgeattn.quantize, edgeattn.runtime and edgeattn.plugins, so the
checks read a copy of the source laid out as the installed package is (scripts/lint_imports.py, which CI runs
through scripts/lint_imports.sh)."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("importlinter", reason="needs import-linter (pip install 'edgeattn[dev]')")


def _load_lint_module():
    spec = importlib.util.spec_from_file_location("lint_imports", ROOT / "scripts" / "lint_imports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


layout = _load_lint_module()


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return layout.installed_layout(tmp_path_factory.mktemp("layout"))


@pytest.fixture(scope="module")
def broken_lint(tmp_path_factory) -> subprocess.CompletedProcess:
    """The linter's answer on a copy with an engine that imports the server and two engines that import each
    other."""
    broken = layout.installed_layout(tmp_path_factory.mktemp("broken"))
    engines = broken / "edgeattn" / "engines"
    (engines / "reaches_up.py").write_text("import edgeattn.runtime.server.app\n")
    (engines / "cycle_a.py").write_text("from edgeattn.engines import cycle_b\n")
    (engines / "cycle_b.py").write_text("from edgeattn.engines import cycle_a\n")
    return layout.lint(broken)


def test_the_lint_script_passes():
    """What CI runs: every module in a layer and every contract kept, on the installed layout."""
    env = {**os.environ, "PYTHON": sys.executable, "NO_COLOR": "1"}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "lint_imports.sh")], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_a_backward_import_breaks_a_contract(broken_lint):
    """The check can fail: an engine that imports the server is reported."""
    assert broken_lint.returncode != 0
    assert "edgeattn.engines.reaches_up -> edgeattn.runtime.server.app" in broken_lint.stdout


def test_a_cycle_between_siblings_breaks_a_contract(broken_lint):
    assert "No cycles are allowed in edgeattn.engines." in broken_lint.stdout
    assert ".cycle_a -> .cycle_b" in broken_lint.stdout or ".cycle_b -> .cycle_a" in broken_lint.stdout


def test_every_module_is_in_a_layer(tree):
    assert layout.modules_in_no_layer(tree) == []


def test_a_module_outside_every_layer_is_listed(tmp_path):
    broken = layout.installed_layout(tmp_path / "broken")
    (broken / "edgeattn" / "stray.py").write_text("")
    (broken / "edgeattn" / "newpkg").mkdir()
    (broken / "edgeattn" / "newpkg" / "__init__.py").write_text("")
    init = broken / "edgeattn" / "attention" / "__init__.py"  # a package split across layers
    init.write_text(init.read_text() + "from edgeattn.attention.torch_module import WindowedAttention\n")
    assert layout.modules_in_no_layer(broken) == [
        "edgeattn.attention: a package split across layers imports edgeattn.attention.torch_module in its __init__",
        "edgeattn.newpkg: in no layer",
        "edgeattn.stray: in no layer",
    ]


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
    broken = layout.installed_layout(tmp_path / "broken")
    (broken / "edgeattn" / "cli" / "peeks.py").write_text("from edgeattn.bundle.build import _parity\n")
    assert "edgeattn.cli.peeks: from edgeattn.bundle.build import _parity" in private_cross_package_imports(broken)
