"""The unversioned `libtensorrt_rtx.so` link that TensorRT for RTX builds need (issue 19, item 12).

It lives in the shared cache folder. It used to be keyed by the library version only, so a build from a
second environment with the same version got the first environment's library put on its library path next
to its own (two copies of TensorRT for RTX in one process: heap corruption), and a link left by another
environment was never checked. A second environment is simulated here the cheap way: a folder that holds a
`tensorrt_rtx_libs` package whose files are hard links to this environment's (a distinct real path, no copy),
put first on PYTHONPATH, so `import tensorrt_rtx` in the build worker loads the libraries from there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

import trt_fixtures as fx
from onnx_fixtures import has

pytestmark = [pytest.mark.rtx, pytest.mark.skipif(not has("tensorrt_rtx"), reason="needs tensorrt-rtx")]

BUILD_AND_REPORT = """
import json, os, sys
from pathlib import Path
import tensorrt_rtx_libs
from edgeattn.bundle.build import BuildConfig, build
from edgeattn.engines.tensorrt import adapter
bundle = build(Path(sys.argv[1]), BuildConfig(target="rtx", precision="fp16", seq=(1, 8, 32), out=Path(sys.argv[2])))
link_dir = adapter.subprocess_env(adapter.flavor("tensorrt_rtx"))["LD_LIBRARY_PATH"].split(os.pathsep)[0]
engine = bundle.manifest.sections["engine"]
print(json.dumps({"libs": os.path.realpath(tensorrt_rtx_libs.__path__[0]),
                  "link": os.path.realpath(os.path.join(link_dir, "libtensorrt_rtx.so")),
                  "plugin": [a["to"] for a in engine["attention"]]}))
"""


def _environment(root: Path) -> Path:
    """A site folder whose tensorrt_rtx_libs is this environment's, hard-linked file by file."""
    import tensorrt_rtx_libs

    src = Path(tensorrt_rtx_libs.__path__[0])
    dst = root / "site" / "tensorrt_rtx_libs"
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            try:
                os.link(f, dst / f.name)
            except OSError:  # another file system: copy (slower, same meaning)
                shutil.copy2(f, dst / f.name)
    return dst.parent


def _build_from(site: Path | None, cache: Path, model: Path, out: Path) -> dict:
    env = {**os.environ, "EDGEATTN_CACHE_DIR": str(cache)}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", BUILD_AND_REPORT, str(model), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "attn.onnx"
    onnx.save(fx.attention(), str(path))
    return path


def test_each_environment_builds_with_its_own_library(tmp_path, model):
    cache = tmp_path / "cache"
    first = _build_from(None, cache, model, tmp_path / "a.edgeattn")
    second_site = _environment(tmp_path / "env_b")
    second = _build_from(second_site, cache, model, tmp_path / "b.edgeattn")
    assert second["libs"] == os.path.realpath(second_site / "tensorrt_rtx_libs") != first["libs"]
    assert first["link"] == os.path.join(first["libs"], "libtensorrt_rtx.so.1")
    assert second["link"] == os.path.join(second["libs"], "libtensorrt_rtx.so.1")
    assert first["plugin"] == second["plugin"] == ["plugin"]
    shutil.rmtree(second_site)  # deleting one environment leaves the other's builds alone
    again = _build_from(None, cache, model, tmp_path / "a2.edgeattn")
    assert again["link"] == first["link"] and again["plugin"] == ["plugin"]


def test_a_stale_link_is_replaced(tmp_path, monkeypatch):
    from edgeattn.engines.tensorrt import adapter

    monkeypatch.setenv("EDGEATTN_CACHE_DIR", str(tmp_path / "cache"))
    fl = adapter.flavor("tensorrt_rtx")
    link = Path(adapter.subprocess_env(fl)["LD_LIBRARY_PATH"].split(os.pathsep)[0]) / "libtensorrt_rtx.so"
    want = os.path.realpath(link)
    elsewhere = tmp_path / "gone" / "libtensorrt_rtx.so.1"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"not a library")
    link.unlink()
    link.symlink_to(elsewhere)  # what another environment, or a deleted one, left behind
    assert Path(adapter.subprocess_env(fl)["LD_LIBRARY_PATH"].split(os.pathsep)[0]) / "libtensorrt_rtx.so" == link
    assert os.path.realpath(link) == want


def test_one_variable_names_the_cache_folder(tmp_path, monkeypatch):
    """Engines and packaged models share one cache folder, named by EDGEATTN_CACHE_DIR alone."""
    from edgeattn import hf_models
    from edgeattn.engines.tensorrt import adapter

    monkeypatch.delenv("EDGEATTN_CACHE", raising=False)
    monkeypatch.setenv("EDGEATTN_CACHE_DIR", str(tmp_path / "c"))
    assert hf_models.cache_dir() == adapter.cache_dir() == tmp_path / "c"
    monkeypatch.setenv("EDGEATTN_CACHE_DIR", "")  # set but empty: the default, as for the engines
    assert hf_models.cache_dir() == adapter.cache_dir() == Path.home() / ".cache" / "edgeattn"
