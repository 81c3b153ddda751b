"""`edgeattn generate --prompt` on a bundle whose tokenizer has a chat template: the prompt goes in as a user
message (an instruct model answers a bare prompt with its end token), `--raw` continues the text as is, and an
empty answer says why."""

from __future__ import annotations

import json

import pytest

from decoder_fixtures import requires_decoder_stack
from edgeattn.cli.main import cli

pytestmark = requires_decoder_stack

PROMPT = "Explain what a heat sink does"


def _usage(runner, path, *extra):
    result = runner.invoke(cli, ["generate", str(path), "--prompt", PROMPT, "--max-tokens", "2", "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_plain_prompt_gets_the_chat_template(tiny_decoder, runner):
    _, tok, _, path = tiny_decoder
    assert tok.chat_template  # the fixture carries SmolLM2's tokenizer and template
    chat = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False)
    assert _usage(runner, path)["usage"]["prompt_tokens"] == len(tok(chat, add_special_tokens=False).input_ids)


def test_raw_prompt_is_plain_completion(tiny_decoder, runner):
    _, tok, _, path = tiny_decoder
    assert _usage(runner, path, "--raw")["usage"]["prompt_tokens"] == len(tok(PROMPT, add_special_tokens=False).input_ids)


def test_raw_with_a_chat_file_is_an_error(tiny_decoder, runner, tmp_path):
    _, _, _, path = tiny_decoder
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([{"role": "user", "content": PROMPT}]))
    result = runner.invoke(cli, ["generate", str(path), "--chat", str(chat), "--raw"])
    assert result.exit_code != 0 and "--raw applies to --prompt" in result.output


@pytest.mark.parametrize("extra, hint", [((), "ended at once"), (("--raw",), "try without --raw")])
def test_an_empty_answer_says_why(tiny_decoder, runner, extra, hint):
    _, _, _, path = tiny_decoder
    args = ["generate", str(path), "--prompt", PROMPT, "--max-tokens", "4", *extra]
    first = json.loads(runner.invoke(cli, [*args, "--json"]).stdout)["text"]
    assert first
    result = runner.invoke(cli, [*args, "--stop", first[:1]])  # stops before any text: an empty answer
    assert result.exit_code == 0, result.output
    assert hint in result.stderr
