"""`edgeattn serve --thermal-policy` with a file that is not a policy at all: one clear error, no traceback."""

from __future__ import annotations

import pytest

from edgeattn.cli.main import cli
from edgeattn.errors import InputError
from edgeattn.runtime.thermal.policy_file import load_policy

BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\x00"


@pytest.mark.parametrize("name", ["policy.toml", "policy.yaml", "policy.json"])
def test_a_binary_policy_file_is_a_clear_error(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(BINARY)
    with pytest.raises(InputError, match=r"expected a UTF-8 text file .* found a byte 0x89 at offset 0"):
        load_policy(path)


def test_yaml_that_does_not_parse_is_a_clear_error(tmp_path):
    pytest.importorskip("yaml")
    path = tmp_path / "policy.yaml"
    path.write_text("kind: [\n  - {\n")
    with pytest.raises(InputError, match=r"policy .*policy\.yaml: cannot parse: .*line 2"):
        load_policy(path)


def test_serve_with_a_binary_policy_file_ends_with_the_reason(tmp_path, runner):
    pytest.importorskip("aiohttp")
    from serve_support import tiny_bundle

    bundle = tiny_bundle(tmp_path)
    policy = tmp_path / "policy.toml"
    policy.write_bytes(BINARY)
    trace = tmp_path / "trace.csv"
    trace.write_text("t,temp_c,power_w\n0,40,5\n1,41,5\n")
    result = runner.invoke(cli, ["serve", str(bundle.path), "--thermal-policy", str(policy),
                                 "--thermal-sensor", f"replay:{trace}", "--port", "0"])
    assert result.exit_code == InputError.exit_code, result.output
    assert "expected a UTF-8 text file" in result.output and str(policy) in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
