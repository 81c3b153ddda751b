"""Every file a bundle loads is listed in its manifest's files, inside the bundle and hashed; a manifest that
points elsewhere, or a file taken out of the list and edited, is refused by inspect, generate and serve alike."""

from __future__ import annotations

import json
import shutil

import pytest

from decoder_fixtures import requires_decoder_stack
from edgeattn.bundle.build import BuildConfig, build
from edgeattn.bundle.folder import open_bundle
from edgeattn.cli.main import cli
from edgeattn.errors import BundleError, InputError


def _copy(bundle_path, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(bundle_path, copy)
    return copy


def _edit_manifest(folder, change):
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


@requires_decoder_stack
def test_a_fast_path_outside_the_bundle_is_refused(tiny_decoder, tmp_path, runner):
    folder = _copy(tiny_decoder[3], tmp_path)
    _edit_manifest(folder, lambda m: m["sections"]["decoder"].update(fast_path_model="/etc/passwd"))
    with pytest.raises(BundleError, match="/etc/passwd"):
        open_bundle(folder)
    result = runner.invoke(cli, ["inspect", str(folder)])
    assert result.exit_code == 3 and "INTEGRITY FAILURE" in result.output and "all files match" not in result.output
    from edgeattn.runtime.generation.decoder_bundle import DecoderModel

    model = DecoderModel(open_bundle(folder, verify=False))  # even opened without the hash check
    with pytest.raises(BundleError, match="hashed files"):
        model._linear_path()  # where the fast path is opened
    result = runner.invoke(cli, ["generate", str(folder), "--prompt", "hello", "--max-tokens", "1"])
    assert result.exit_code == 3 and "/etc/passwd" in result.output


@requires_decoder_stack
def test_a_tokenizer_taken_out_of_the_list_and_edited_is_refused(tiny_decoder, tmp_path, runner):
    folder = _copy(tiny_decoder[3], tmp_path)
    _edit_manifest(folder, lambda m: m["files"].pop("tokenizer.json"))
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(BundleError, match="tokenizer.json is loaded by the runtime but is not among the hashed"):
        open_bundle(folder)
    result = runner.invoke(cli, ["inspect", str(folder)])
    assert result.exit_code == 3 and "INTEGRITY FAILURE" in result.output
    result = runner.invoke(cli, ["generate", str(folder), "--prompt", "hello", "--max-tokens", "1"])
    assert result.exit_code == 3 and "tokenizer.json" in result.output
    from edgeattn.runtime.generation.decoder_bundle import DecoderModel

    with pytest.raises(BundleError, match="tokenizer.json"):
        DecoderModel(open_bundle(folder, verify=False))


def test_bundle_file_hands_out_only_hashed_files_inside_the_bundle(tiny_onnx, tmp_path):
    bundle = build(tiny_onnx, BuildConfig(target="cpu", out=tmp_path / "b"))
    assert bundle.file("model.onnx") == (tmp_path / "b" / "model.onnx").resolve()
    (bundle.path / "extra.json").write_text("{}")
    for name in ("extra.json", "../tiny.onnx", "/etc/passwd", "manifest.json"):
        with pytest.raises(BundleError, match="hashed files"):
            bundle.file(name)


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b"[1, 2, 3]", b'"text"', b"\xff\xfe{"])
def test_a_manifest_that_is_not_a_manifest_is_a_bundle_error(tiny_onnx, tmp_path, runner, content):
    bundle = build(tiny_onnx, BuildConfig(target="cpu", out=tmp_path / "b"))
    (bundle.path / "manifest.json").write_bytes(content)
    with pytest.raises(BundleError, match="manifest"):
        open_bundle(bundle.path)
    result = runner.invoke(cli, ["inspect", str(bundle.path)])
    assert result.exit_code == 3 and "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


def test_an_out_that_cannot_be_written_is_an_input_error(tiny_onnx, runner):
    with pytest.raises(InputError, match="expected a place this user can write"):
        build(tiny_onnx, BuildConfig(target="cpu", out="/proc/edgeattn-test/b"))
    result = runner.invoke(cli, ["build", str(tiny_onnx), "--target", "cpu", "--out", "/proc/edgeattn-test/b"])
    assert result.exit_code == 2 and "expected a place this user can write" in result.output
    assert isinstance(result.exception, SystemExit)


def test_a_pipeline_work_dir_that_cannot_be_written_is_an_input_error(tiny_onnx, tmp_path):
    from edgeattn.pipeline import load, run

    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[[stage]]\nkind = "build"\nmodel = "{tiny_onnx}"\ntarget = "cpu"\n')
    with pytest.raises(InputError, match="expected a folder this user can write"):
        run(load(recipe, work_dir="/proc/edgeattn-test/work"))
