"""Puts the model's Python environment on the Python-backend stub's `sys.path`, before numpy is imported.

Triton's Python-backend stub embeds a Python of its own (the system libpython, not a virtualenv) and does not
pass PYTHONPATH on; it imports `model.py` before `triton_python_backend_utils` (which imports numpy). So
`edgeattn export-triton --python-path DIR` writes the folders into the model's config.pbtxt (parameter
`edgeattn_python_path`, os.pathsep-separated) and copies this file beside `model.py` as
`edgeattn_environment.py`; `model.py` calls `use(__file__)` first thing. Each folder is added as a site
directory (its .pth files run, so editable installs work) and goes in front of sys.path, the first folder
first: put a folder holding numpy < 2 first (the stub needs numpy 1), then the virtualenv's site-packages.
Standard library only: nothing else can be imported yet.
"""

from __future__ import annotations

import os
import re
import site
import sys
from pathlib import Path

PARAMETER = "edgeattn_python_path"
_VALUE = re.compile(r'key:\s*"' + PARAMETER + r'"\s*value:\s*\{\s*string_value:\s*"([^"]*)"')


def folders(config_text: str) -> list[str]:
    """The folders that config.pbtxt's `edgeattn_python_path` parameter names (empty when it has none)."""
    match = _VALUE.search(config_text)
    return [p for p in match.group(1).split(os.pathsep) if p] if match else []


def add(paths: list[str]) -> None:
    """Each path as a site directory; each, followed by what its .pth files add, goes in front of sys.path, in order."""
    front: list[str] = []
    for path in map(os.path.abspath, paths):
        before = set(sys.path)
        site.addsitedir(path)
        front += [path] + [p for p in sys.path if p not in before and p != path]
    front = list(dict.fromkeys(front))
    sys.path[:] = front + [p for p in sys.path if p not in front]


def use(model_file: str) -> list[str]:
    """Read `<model>/config.pbtxt` (model.py lies in `<model>/<version>/`) and add its folders; returns them."""
    config = Path(model_file).resolve().parents[1] / "config.pbtxt"
    paths = folders(config.read_text(encoding="utf-8")) if config.is_file() else []
    add(paths)
    return paths
