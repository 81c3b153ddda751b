"""edgeattn pipeline end to end: stages run in order, reruns do only what changed, a killed run resumes
to a correct result, and every bundle carries the chain of stages that made it.

The fast tests run a build + export-triton recipe on a tiny ONNX model; the slow ones run the MiniLM
recipe (2:4 with W8A8 QAT, cpu and rtx bundles) with tiny step counts, killed during QAT once."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest

from edgeattn.bundle.manifest import sha256_file
from edgeattn.pipeline import load, plan, run
from onnx_fixtures import has, requires_minilm, requires_torch, tiny_model

RECIPES = Path(__file__).parent / "data" / "recipes"  # recipe texts; tiny and minilm are templates
TINY = (RECIPES / "tiny.toml").read_text()


def tiny_recipe(tmp_path: Path, seq=(1, 8, 32), delay=100) -> Path:
    if not (tmp_path / "tiny.onnx").exists():
        onnx.save(tiny_model(), str(tmp_path / "tiny.onnx"))
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(seq=list(seq), delay=delay))
    return path


def events_of(recipe_path: Path, **kw) -> dict[str, str]:
    """Run the recipe; stage -> what happened to it (done, up to date, skip)."""
    seen = {}
    run(load(recipe_path), on_event=lambda e: seen.__setitem__(e.stage, e.what) if e.what != "progress" else None,
        **kw)
    return seen


def test_rerun_does_no_work_and_a_change_reruns_that_stage_and_the_ones_after_it(tmp_path):
    path = tiny_recipe(tmp_path)
    work = tmp_path / "tiny.pipeline"
    assert events_of(path) == {"build": "done", "export-triton": "done"}
    record = json.loads((work / "build" / "stage.json").read_text())
    assert events_of(path) == {"build": "up to date", "export-triton": "up to date"}
    assert json.loads((work / "build" / "stage.json").read_text()) == record  # nothing rewritten

    tiny_recipe(tmp_path, delay=200)  # an option of the last stage: only it reruns
    assert [(s.stage.name, s.action, s.reason) for s in plan(load(path))] == [
        ("build", "up to date", "key and outputs unchanged"),
        ("export-triton", "run", "options changed: max_queue_delay_us")]
    assert events_of(path) == {"build": "up to date", "export-triton": "done"}
    assert "max_queue_delay_microseconds: 200" in (work / "export-triton" / "repo" / "tiny" / "config.pbtxt").read_text()

    tiny_recipe(tmp_path, seq=(1, 8, 64), delay=200)  # a build option: the build and the stage after it
    assert [s.reason for s in plan(load(path))] == ["options changed: seq", "after build runs (if its output changes)"]
    assert events_of(path) == {"build": "done", "export-triton": "done"}
    assert json.loads((work / "build" / "bundle" / "manifest.json").read_text())["shape_ranges"]["seq"] == [1, 8, 64]

    onnx.save(tiny_model(seed=1), str(tmp_path / "tiny.onnx"))  # the input changed
    assert plan(load(path))[0].reason == "input changed: model"
    assert events_of(path) == {"build": "done", "export-triton": "done"}

    (work / "build" / "bundle" / "report.md").write_text("edited\n")  # an output altered by hand
    assert plan(load(path))[0].reason == "output bundle/report.md changed since it was written"
    assert events_of(path)["build"] == "done"
    assert events_of(path, from_stage="export-triton") == {"build": "up to date", "export-triton": "done"}
    assert events_of(path, force=True) == {"build": "done", "export-triton": "done"}


def test_the_bundle_manifest_carries_the_chain_and_inspect_shows_it(tmp_path, runner):
    from edgeattn.cli.main import cli

    path = tiny_recipe(tmp_path)
    records = run(load(path))
    bundle = tmp_path / "tiny.pipeline" / "build" / "bundle"
    manifest = json.loads((bundle / "manifest.json").read_text())
    (entry,) = manifest["sections"]["pipeline"]
    assert entry["name"] == "build" and entry["kind"] == "build" and entry["key"] == records["build"].key
    assert entry["options"] == {"model": "tiny.onnx", "target": "cpu", "seq": [1, 8, 32], "name": "tiny"}
    assert entry["inputs"] == {"model": sha256_file(tmp_path / "tiny.onnx")}
    assert entry["tools"]["edgeattn"] and entry["tools"]["onnxruntime"]
    assert manifest["name"] == "tiny" and manifest["sections"]["parity"]["status"] == "pass"
    stage = json.loads((tmp_path / "tiny.pipeline" / "build" / "stage.json").read_text())
    assert stage["outputs"]["bundle/manifest.json"] == sha256_file(bundle / "manifest.json")
    assert stage["seconds"] > 0 and stage["summary"]["parity"] == "pass"
    result = runner.invoke(cli, ["inspect", str(bundle)])
    assert result.exit_code == 0, result.output
    assert "pipeline: the stages that made this bundle" in result.output and "all files match" in result.output


def test_a_stage_stopped_midway_leaves_nothing_half_written(tmp_path):
    path = tiny_recipe(tmp_path)
    work = tmp_path / "tiny.pipeline"

    def stop_in_the_engine_build(event):
        if event.what == "progress" and event.text.startswith("engine for"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(load(path), on_event=stop_in_the_engine_build)
    assert sorted(p.name for p in work.iterdir()) == [".lock"]  # no stage folder, no staging folder
    dead = work / ".build.999999999.x1.partial"  # what SIGKILL leaves: a staging folder of a dead process
    dead.mkdir()
    (dead / "model.onnx").write_text("half")
    assert events_of(path) == {"build": "done", "export-triton": "done"}
    assert not dead.exists() and not list(work.glob(".*.partial"))


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path, runner):
    from edgeattn.cli.main import cli

    path = tiny_recipe(tmp_path)
    result = runner.invoke(cli, ["pipeline", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "no earlier run" in result.output and "after build runs" in result.output
    assert not (tmp_path / "tiny.pipeline").exists()
    result = runner.invoke(cli, ["pipeline", str(path), "--from", "nope"])
    assert result.exit_code == 2 and "--from nope: expected a stage of tiny.toml (build, export-triton)" in result.output


def test_a_second_run_on_the_same_work_folder_is_refused(tmp_path):
    import fcntl

    from edgeattn.errors import InputError

    path = tiny_recipe(tmp_path)
    work = tmp_path / "tiny.pipeline"
    work.mkdir()
    with open(work / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(InputError, match="another pipeline run is using this folder"):
            run(load(path))
    assert sorted(p.name for p in work.iterdir()) == [".lock"]
    assert events_of(path) == {"build": "done", "export-triton": "done"}


@requires_minilm
def test_a_packaged_recipe_by_name(tmp_path, runner):
    from edgeattn.cli.main import cli

    result = runner.invoke(cli, ["pipeline", "minilm-2to4-w8a8", "--dry-run", "--work-dir", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    assert "sparsify" in result.output and "build-rtx" in result.output and "no earlier run" in result.output


# --- MiniLM: 2:4, W8A8 QAT, cpu + rtx bundles, from one command ---------------------------------------

MINILM = (RECIPES / "minilm-24-w8a8.toml").read_text()

WORDS = (["The engineer", "A small robot", "The camera", "Our team", "The river", "A student"],
         ["measured", "watched", "carried", "described", "repaired", "followed"],
         ["the morning light", "a long bridge", "the quiet harbour", "three red boxes", "the new engine"],
         ["before noon.", "with great care.", "after the rain.", "near the station."])


def minilm_recipe(folder: Path, seq=(1, 16, 64)) -> Path:
    sentences = [f"{a} {b} {c} {d}" for a in WORDS[0] for b in WORDS[1][:2] for c in WORDS[2][:2] for d in WORDS[3][:2]]
    (folder / "calib.txt").write_text("\n".join(sentences) + "\n")  # 48 sentences: QAT stays short
    path = folder / "minilm.toml"
    path.write_text(MINILM.format(seq=list(seq)))
    return path


def edgeattn(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeattn.cli.main", *map(str, args)], capture_output=True,
                          text=True, **kw)


@pytest.fixture(scope="module")
def killed_then_finished(tmp_path_factory):
    """Start the MiniLM recipe, SIGKILL it during QAT, look at what it left, start it again."""
    folder = tmp_path_factory.mktemp("minilm_pipeline")
    path = minilm_recipe(folder)
    work = folder / "minilm.pipeline"
    proc = subprocess.Popen([sys.executable, "-m", "edgeattn.cli.main", "pipeline", str(path)],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "QAT w8a8" in line:
            time.sleep(2)
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    left = sorted(p.name for p in work.iterdir())
    rerun = edgeattn("pipeline", path)
    assert rerun.returncode == 0, rerun.stderr
    return {"recipe": path, "work": work, "left": left, "rerun": rerun}


@requires_torch
@requires_minilm
@pytest.mark.torch
@pytest.mark.slow
def test_killed_during_qat_the_restarted_run_gives_bundles_that_pass_parity(killed_then_finished):
    work = killed_then_finished["work"]
    left = killed_then_finished["left"]
    assert "sparsify" not in left and any(n.startswith(".sparsify.") and n.endswith(".partial") for n in left), left
    assert "sparsify: running (no earlier run)" in killed_then_finished["rerun"].stderr
    assert not list(work.rglob("*.partial")) and not list(work.rglob("*.tmp"))
    cpu = json.loads((work / "build-cpu" / "bundle" / "manifest.json").read_text())
    assert cpu["sections"]["parity"]["status"] == "pass"
    # W8A8: the 36 Linear layers run as integer ops on the cpu; only attention's 12 MatMuls stay float
    assert cpu["precision"]["qdq_nodes"] > 0 and cpu["precision"]["compute_layers"] == {"float": 12, "int8": 36}
    assert not [p for p in cpu["sections"]["problems"] if "2:4" in p]  # q/k/v packed by fusion are still found
    assert all("WindowedAttention" in n for n in cpu["precision"]["float_layers"])
    sparsify = json.loads((work / "sparsify" / "stage.json").read_text())
    assert sparsify["summary"]["masks_kept"] is True and sparsify["summary"]["pruned"] >= 36
    check = edgeattn("check-sparsity", work / "sparsify" / "model.onnx", "--json")
    assert check.returncode == 0, check.stderr
    assert len([e for e in json.loads(check.stdout)["layers"] if e["sparse"]]) >= 36  # 2:4 behind DequantizeLinear
    if has("tensorrt_rtx"):
        rtx = json.loads((work / "build-rtx" / "bundle" / "manifest.json").read_text())
        assert rtx["backend"] == "tensorrt_rtx" and (work / "build-rtx" / "bundle" / rtx["artifact"]).stat().st_size > 0
    # the chain: the bundle was built from exactly the model the sparsify stage wrote
    chain = cpu["sections"]["pipeline"]
    assert [e["name"] for e in chain] == ["sparsify", "build-cpu"]
    assert chain[0]["outputs"]["model.onnx"] == sha256_file(work / "sparsify" / "model.onnx")
    assert chain[0]["options"]["qat"] == "w8a8" and chain[0]["seconds"] > 0


@requires_torch
@requires_minilm
@pytest.mark.torch
@pytest.mark.slow
def test_unchanged_rerun_is_fast_and_a_build_option_reruns_only_that_build(killed_then_finished):
    path, work = killed_then_finished["recipe"], killed_then_finished["work"]
    records = {p.parent.name: p.read_text() for p in work.glob("*/stage.json")}
    again = edgeattn("pipeline", path)
    assert again.returncode == 0, again.stderr
    assert "sparsify: up to date" in again.stderr and "build-cpu: up to date" in again.stderr
    assert {p.parent.name: p.read_text() for p in work.glob("*/stage.json")} == records

    minilm_recipe(path.parent, seq=(1, 16, 128))  # both builds' seq changes; the sparsify stage's does not
    changed = edgeattn("pipeline", path)
    assert changed.returncode == 0, changed.stderr
    assert "sparsify: up to date" in changed.stderr
    assert "build-cpu: running (options changed: seq)" in changed.stderr
    assert (work / "sparsify" / "stage.json").read_text() == records["sparsify"]
    manifest = json.loads((work / "build-cpu" / "bundle" / "manifest.json").read_text())
    assert manifest["shape_ranges"]["seq"] == [1, 16, 128] and manifest["sections"]["parity"]["status"] == "pass"


TINY_BERT = (RECIPES / "tiny-bert.toml").read_text()


@requires_torch
@requires_minilm
@pytest.mark.torch
@pytest.mark.slow
def test_export_and_quantize_stages_on_a_tiny_bert(tmp_path):
    """The export and quantize stages run their functions for real (a 1-layer BERT keeps it short)."""
    import shutil

    import torch
    import transformers

    from edgeattn import hf_models

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=128)
    transformers.BertModel(config).save_pretrained(tmp_path / "bert")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (hf_models.resolve("minilm") / name).is_file():
            shutil.copy(hf_models.resolve("minilm") / name, tmp_path / "bert" / name)
    minilm_recipe(tmp_path)  # for its calib.txt
    path = tmp_path / "tiny-bert.toml"
    path.write_text(TINY_BERT)
    records = run(load(path))
    assert list(records) == ["export", "build-float", "quantize", "build-w8a8"]
    work = tmp_path / "tiny-bert.pipeline"
    float_bundle = json.loads((work / "build-float" / "bundle" / "manifest.json").read_text())
    assert float_bundle["sections"]["parity"]["max_abs_diff"] <= 1e-4
    assert [e["name"] for e in float_bundle["sections"]["pipeline"]] == ["export", "build-float"]
    assert records["quantize"].summary["quantized_matmuls"] == 6  # q, k, v, o, intermediate, output
    assert records["quantize"].inputs["option calib"] == sha256_file(tmp_path / "calib.txt")
    w8a8 = json.loads((work / "build-w8a8" / "bundle" / "manifest.json").read_text())
    assert w8a8["sections"]["parity"]["status"] == "pass" and w8a8["precision"]["qdq_nodes"] > 0
    assert [e["name"] for e in w8a8["sections"]["pipeline"]] == ["quantize", "build-w8a8"]
