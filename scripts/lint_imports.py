"""Check the import contracts of pyproject.toml ([tool.importlinter]) on the package as it installs.

quantize/, runtime/ and plugins/ install as edgeattn.quantize, edgeattn.runtime and edgeattn.plugins, so a
plain `lint-imports` in the repository cannot find them ("Missing layer edgeattn.runtime.server"). This copies
the source into a temporary folder laid out as the installed package, then:

1. lists the modules that belong to no layer of the layers contract (a new module cannot slip out of it);
2. runs `lint-imports` with pyproject's contracts on the copy.

    .venv/bin/python scripts/lint_imports.py      # or: bash scripts/lint_imports.sh

Exits 0 when every module has a layer and every contract is kept, 1 otherwise. tests/test_architecture.py uses
the same functions.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
FOLDERS = ("quantize", "runtime", "plugins")  # repository folder == name under edgeattn once installed


def installed_layout(dest: Path, root: Path = ROOT) -> Path:
    """Copy the source into `dest` laid out as installed (dest/edgeattn/{quantize,runtime,plugins}); `dest`."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(root / "edgeattn", dest / "edgeattn", ignore=ignore)
    for folder in FOLDERS:
        shutil.copytree(root / folder, dest / "edgeattn" / folder, ignore=ignore)
    return dest


def lint(tree: Path, config: Path = PYPROJECT) -> subprocess.CompletedProcess:
    """Run lint-imports (the one beside this interpreter) with `config`'s contracts on a laid-out `tree`."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    env = {"PYTHONPATH": str(tree), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NO_COLOR": "1"}
    return subprocess.run([str(lint_imports), str(config)], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=300)


def layer_modules(config: Path = PYPROJECT) -> list[str]:
    """Every module named as a layer (or a sibling inside one) by the layers contracts of `config`."""
    contracts = tomllib.loads(config.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    names = []
    for contract in contracts:
        if contract["type"] != "layers":
            continue
        for layer in contract["layers"]:
            names += [part.strip(" ()") for part in layer.replace("|", ":").split(":")]
    return names


def _module_files(tree: Path) -> dict[str, Path]:
    """module name -> file, for every module under tree/edgeattn."""
    found = {}
    for path in sorted((tree / "edgeattn").rglob("*.py")):
        parts = path.relative_to(tree).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _edgeattn_imports(path: Path) -> list[str]:
    imported = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("edgeattn"):
            imported.append(node.module)
        elif isinstance(node, ast.Import):
            imported += [a.name for a in node.names if a.name.startswith("edgeattn")]
    return imported


def modules_in_no_layer(tree: Path, config: Path = PYPROJECT) -> list[str]:
    """Modules of the laid-out `tree` outside every layer, each with why.

    A package split across layers (edgeattn.attention: the reference below the kernels, the torch module above
    them) is in no layer itself: its __init__ may hold constants, but an import of edgeattn there would escape
    the contract, so it is reported (the lowest layer, the errors, excepted)."""
    layers = layer_modules(config)
    lowest = layers[-1]

    def in_layer(module: str) -> bool:
        return any(module == layer or module.startswith(layer + ".") for layer in layers)

    found = []
    for module, path in _module_files(tree).items():
        if in_layer(module):
            continue
        holds_layers = any(layer.startswith(module + ".") for layer in layers)
        if not holds_layers:
            found.append(f"{module}: in no layer")
            continue
        for imported in _edgeattn_imports(path):
            if not (imported == lowest or imported.startswith(lowest + ".")):
                found.append(f"{module}: a package split across layers imports {imported} in its __init__")
    return found


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="edgeattn-layout-") as tmp:
        tree = installed_layout(Path(tmp))
        outside = modules_in_no_layer(tree)
        for line in outside:
            print(f"no layer: {line}")
        if outside:
            print(f"{len(outside)} module(s) in no layer: add each to a layer in {PYPROJECT.name} "
                  "([tool.importlinter], the layers contract)")
        result = lint(tree)
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        return 1 if outside or result.returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
