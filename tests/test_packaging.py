"""The package layout: light CLI, unambiguous import names."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "tensorrt", "tensorrt_rtx", "triton", "transformers", "cuda")


def test_help_imports_nothing_heavy():
    code = ("import sys\nfrom edgeattn.cli.main import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
    assert "build" in out and "bench" in out


def test_runtime_imports_nothing_heavy():
    code = ("import sys, edgeattn.runtime.backends, edgeattn.runtime.backends.onnxruntime, edgeattn.bench\n"
            "import edgeattn.runtime.server.app, edgeattn.runtime.server.runner, edgeattn.cli.serve_cmd\n"
            "import edgeattn.cli.window_cmd\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_subpackages_install_under_edgeattn():
    import edgeattn.plugins
    import edgeattn.quantize
    import edgeattn.runtime

    assert Path(edgeattn.quantize.__file__).parent == REPO / "quantize"
    assert Path(edgeattn.runtime.__file__).parent == REPO / "runtime"
    assert Path(edgeattn.plugins.__file__).parent == REPO / "plugins"


def test_bare_import_is_refused():
    for name in ("runtime", "quantize", "plugins"):
        proc = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode != 0
        assert f"edgeattn.{name}" in proc.stderr
