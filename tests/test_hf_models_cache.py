"""The packaged SmolLM2 checkpoint is converted into the cache once, also when processes ask for it together (two
commands started at once, test workers): the second waits for the first and reads its folder."""

from __future__ import annotations

import threading
import time

from edgeattn import hf_models


def test_processes_asking_together_convert_once(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEATTN_CACHE_DIR", str(tmp_path / "cache"))
    calls, started = [], threading.Event()

    def convert(root, out):  # stands in for the GGUF conversion: slow, and the folder appears at its end
        calls.append(out)
        started.set()
        time.sleep(0.3)  # the other caller arrives meanwhile (or after: either way one conversion)
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"")
        (out / "config.json").write_text("{}")
        return out

    monkeypatch.setattr(hf_models, "_convert_smollm2", convert)
    got = []
    first = threading.Thread(target=lambda: got.append(hf_models._smollm2_checkpoint(tmp_path)))
    first.start()
    started.wait()
    got.append(hf_models._smollm2_checkpoint(tmp_path))  # asks while the first is converting
    first.join()
    assert len(calls) == 1 and got == [tmp_path / "cache" / "smollm2-135m-instruct"] * 2


def test_a_cache_that_cannot_be_written_is_not_a_lock_error(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")  # the cache "folder" is a file: no lock file can be made in it
    monkeypatch.setenv("EDGEATTN_CACHE_DIR", str(blocked))
    monkeypatch.setattr(hf_models, "_convert_smollm2", lambda root, out: "converted")
    assert hf_models._smollm2_checkpoint(tmp_path) == "converted"
