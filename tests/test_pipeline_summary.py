"""The end of a pipeline run: what ran and what was up to date, said truthfully; a fidelity far below the one
the recipe expects, and bundles with problems, flagged."""

from pathlib import Path

import onnx
import pytest

from edgeattn import recipes
from edgeattn.cli.main import cli
from edgeattn.errors import ConfigError
from edgeattn.pipeline import load
from edgeattn.pipeline.state import StageRecord
from edgeattn.pipeline.summary import far_below, fidelity_warnings, problem_lines, run_line
from onnx_fixtures import tiny_model

TINY = (Path(__file__).parent / "data" / "recipes" / "tiny.toml").read_text()


def _record(name: str, **summary) -> StageRecord:
    return StageRecord(name, "sparsify", "k", {}, {}, summary=summary)


def test_run_line_counts_what_ran_apart_from_what_was_up_to_date():
    assert run_line("m", ["a", "b", "c", "d"], [], ["e"], "w") == "m: ran 4 stages, 0 up to date, 1 skipped, in w"
    assert run_line("m", [], ["a", "b"], [], "w") == "m: ran 0 stages, 2 up to date, in w"
    assert run_line("m", ["a"], ["b"], [], "w") == "m: ran 1 stage, 1 up to date, in w"


def test_cli_summary_after_a_run_and_after_a_rerun(tmp_path, runner):
    onnx.save(tiny_model(), str(tmp_path / "tiny.onnx"))
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(TINY.format(seq=[1, 8, 32], delay=100))
    first = runner.invoke(cli, ["pipeline", str(recipe)])
    assert first.exit_code == 0, first.output
    assert "tiny: ran 2 stages, 0 up to date, in" in first.stdout
    again = runner.invoke(cli, ["pipeline", str(recipe)])
    assert "tiny: ran 0 stages, 2 up to date, in" in again.stdout
    assert "warning" not in again.stderr


@pytest.mark.parametrize("measured, flagged", [
    ({"metric": "cosine", "cos_mean": 0.80}, True),
    ({"metric": "cosine", "cos_mean": 0.955}, False),  # within 0.02 of 0.963
    ({"metric": "cosine", "cos_mean": 0.99}, False),
    ({}, False),
])
def test_cosine_far_below_the_expected_one_is_flagged(measured, flagged):
    assert bool(far_below({"expect_cos_mean": 0.963}, measured)) is flagged


def test_perplexity_far_above_the_expected_increase_is_flagged():
    assert far_below({"expect_ppl_increase_pct": 21.1}, {"ppl_increase_pct": 45.0})
    assert not far_below({"expect_ppl_increase_pct": 21.1}, {"ppl_increase_pct": 25.0})
    assert not far_below({}, {"ppl_increase_pct": 400.0})  # a recipe that expects nothing flags nothing


def test_fidelity_warning_names_the_stage_the_result_and_the_expectation():
    records = {"sparsify": _record("sparsify", fidelity={"metric": "cosine", "cos_mean": 0.8012}),
               "build-cpu": _record("build-cpu", problems=0)}
    (line,) = fidelity_warnings({"expect_cos_mean": 0.963}, records, "minilm-2to4-w8a8")
    assert "'sparsify'" in line and "0.8012" in line and "0.963" in line


def test_bundles_with_problems_are_named():
    records = {"build-cpu": _record("build-cpu", problems=3), "build-rtx": _record("build-rtx", problems=0)}
    lines = problem_lines(records, {"build-cpu": "w/build-cpu/bundle", "build-rtx": "w/build-rtx/bundle"})
    assert lines == ["stage 'build-cpu': the bundle lists 3 problems (edgeattn inspect w/build-cpu/bundle)"]


def test_packaged_minilm_recipe_states_its_expected_fidelity():
    assert dict(load(recipes.find("minilm-2to4-w8a8"), work_dir="w").expect)["expect_cos_mean"] > 0.9


@pytest.mark.parametrize("value", ['"high"', "1.5", "true"])
def test_a_bad_expected_fidelity_is_a_config_error(tmp_path, value):
    onnx.save(tiny_model(), str(tmp_path / "tiny.onnx"))
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(TINY.format(seq=[1, 8, 32], delay=100).replace('name = "tiny"', f'name = "tiny"\nexpect_cos_mean = {value}'))
    with pytest.raises(ConfigError, match="expect_cos_mean"):
        load(recipe)
