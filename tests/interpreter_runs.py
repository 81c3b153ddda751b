"""The kernels' interpreter cases (tests/*_cases.py): each runs in its own process under TRITON_INTERPRET=1 and prints
one JSON line of check -> error as its last line.

They are single-threaded and take minutes together, so they do not wait for their tests: when collection ends,
conftest.py hands the selected tests to `start`, which runs the scripts those tests need one after another in a
background thread, in the order the tests come. The rest of the suite runs meanwhile on the other cores; a test
that needs a script's result waits for it in `result` (and runs it itself if nothing started it, as when a module is
imported outside pytest's collection).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from onnx_fixtures import has

HERE = Path(__file__).parent
TIMEOUT_S = 1800  # a script's own limit: minutes on a quiet machine, several times that on a loaded one

# the fixture that reads a script's result -> the script
SCRIPTS = {
    "budget_kernel_errors": "budget_gpu_cases.py",
    "fp8_kernel_errors": "fp8_interpret_cases.py",
    "fused_errors": "fused_decode_cases.py",
    "generation_results": "generation_torch_cases.py",
    "hopper_errors": "kernels_hopper_cases.py",
    "kernel_errors": "kernels_interpret_cases.py",
}


@dataclass
class _Run:
    script: str
    done: threading.Event = field(default_factory=threading.Event)
    output: subprocess.CompletedProcess | None = None
    process: subprocess.Popen | None = None


_runs: dict[str, _Run] = {}
_lock = threading.Lock()


def _command(script: str) -> tuple[list[str], dict[str, str]]:
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    return [sys.executable, str(HERE / script)], dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)


def _execute(run: _Run) -> None:
    command, env = _command(run.script)
    try:
        run.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            out, err = run.process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            run.process.kill()
            out, err = run.process.communicate()
            err += f"\n{run.script}: killed after {TIMEOUT_S} s"
        run.output = subprocess.CompletedProcess(command, run.process.returncode, out, err)
    except Exception as e:  # noqa: BLE001 - handed to the test that reads this script
        run.output = subprocess.CompletedProcess(command, -1, "", f"{run.script}: could not run: {e!r}")
    finally:
        run.done.set()


def start(items) -> None:
    """Run, in a background thread, the scripts whose fixtures the selected `items` use, in the items' order."""
    if not (has("triton") and has("torch")):
        return  # their tests are skipped
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # with pytest -n, every worker collects every test: each runs a script when a test of its asks
    wanted = []
    for item in items:
        if item.get_closest_marker("skip") or any(m.args and m.args[0] is True for m in item.iter_markers("skipif")):
            continue
        for name in getattr(item, "fixturenames", ()):
            script = SCRIPTS.get(name)
            if script and script not in wanted:
                wanted.append(script)
    with _lock:
        queue = [_runs.setdefault(s, _Run(s)) for s in wanted if s not in _runs]
    if queue:
        threading.Thread(target=lambda: [_execute(r) for r in queue], name="interpreter-runs", daemon=True).start()


def stop() -> None:
    """End a script still running (the session ended first, as with -x or ^C)."""
    for run in list(_runs.values()):
        if run.process is not None and run.process.poll() is None:
            run.process.kill()


def result(fixture: str) -> dict:
    """The JSON line the fixture's script printed last; fails with the script's stderr if it failed."""
    script = SCRIPTS[fixture]
    with _lock:
        run = _runs.get(script)
        mine = run is None
        if mine:
            run = _runs[script] = _Run(script)
    if mine:
        _execute(run)
    run.done.wait()
    done = run.output
    assert done.returncode == 0, f"{script} exited with {done.returncode}:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])
