"""edgeattn generate."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--prompt", help="The prompt text: a user message in the bundle's chat template when it has one "
                               "(see --raw).")
@click.option("--chat", "chat_file", type=click.Path(path_type=Path),
              help="A JSON file of chat messages ([{\"role\": ..., \"content\": ...}]); the bundle's chat template applies.")
@click.option("--raw", is_flag=True,
              help="Continue --prompt as plain text (raw completion), without the chat template.")
@click.option("--max-tokens", default=128, show_default=True, help="New tokens at most.")
@click.option("--temperature", default=0.0, show_default=True, help="0 = greedy.")
@click.option("--top-p", default=1.0, show_default=True)
@click.option("--top-k", default=0, show_default=True, help="0 = no limit.")
@click.option("--seed", type=int, help="Makes sampling reproducible.")
@click.option("--stop", multiple=True, help="Stop when this text appears (not included); repeatable.")
@click.option("--window", default=0, show_default=True,
              help="Attention window in tokens (sinks kept); 0 = the whole ring.")
@click.option("--budget", type=int, help="Attention budget in cache rows (sinks + window + retrieval pages of the "
              "bundle's page size, set at export): the window and the pages whose keys best match each query "
              "[default: the window alone].")
@click.option("--budget-recent", type=float, help="Share of the budget's non-sink rows given to the recent window, "
              "the rest to retrieval pages (1 = the window alone) [default: 0.25].")
@click.option("--prompt-attention", type=click.Choice(["budget", "whole"]), default="budget", show_default=True,
              help="What the prompt reads: the window or budget, as generated tokens do, or every cached row (whole: "
                   "the window or budget bounds the generated tokens only).")
@click.option("--window-max", type=int, help="Ring size to allocate [default: the bundle's].")
@click.option("--threads", default=0, help="ONNX Runtime threads (0 = its default).")
@click.option("--stream", is_flag=True, help="Print text as it is generated.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (text, tokens, usage, timing).")
def generate(bundle, prompt, chat_file, raw, max_tokens, temperature, top_p, top_k, seed, stop, window, budget,
             budget_recent, prompt_attention, window_max, threads, stream, as_json):
    """Generate text from a decoder BUNDLE (built from `edgeattn export MODEL --decoder`)."""
    from edgeattn.attention.budget import DEFAULT_RECENT
    from edgeattn.errors import InputError
    from edgeattn.runtime.generation.generator import GenerationConfig, GenerationResult, Generator
    from edgeattn.runtime.generation.sampling import SamplingConfig

    if (prompt is None) == (chat_file is None):
        raise InputError("expected exactly one of --prompt TEXT and --chat FILE")
    if raw and chat_file is not None:
        raise InputError("--raw applies to --prompt TEXT; --chat FILE always uses the chat template")
    source = prompt
    if chat_file is not None:
        try:
            source = json.loads(Path(chat_file).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"--chat {chat_file}: expected a JSON list of messages, found: {exc}") from None
    if budget is not None and window:
        raise InputError(f"expected --window or --budget, found both (--window {window}, --budget {budget}): "
                         f"a budget holds its own window (see --budget-recent)")
    if budget_recent is not None and budget is None:
        raise InputError("--budget-recent splits a budget: give --budget N too")
    config = GenerationConfig(max_tokens=max_tokens, stop=tuple(stop), window=window, budget=budget,
                              budget_recent=DEFAULT_RECENT if budget_recent is None else budget_recent,
                              prompt_attention=prompt_attention,
                              sampling=SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed))
    result = GenerationResult("", [], "length", 0, 0, [])
    with Generator.open(bundle, window_max=window_max, threads=threads) as gen:
        source = _as_chat(source, gen.model.codec, raw)
        for chunk in gen.stream(source, config, result=result):
            if stream and not as_json:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    if as_json:
        click.echo(json.dumps({"text": result.text, "tokens": result.tokens, "finish_reason": result.finish_reason,
                               "usage": {"prompt_tokens": result.prompt_tokens,
                                         "completion_tokens": result.completion_tokens,
                                         "evicted_prompt_tokens": result.evicted_prompt_tokens},
                               "prefill_s": round(result.prefill_s, 4), "decode_s": round(result.decode_s, 4),
                               "attention_window": result.windows[-1] if result.windows else None,
                               "attention_budget": result.budgets[-1] if result.budgets else None}))
        return
    if stream:
        click.echo("")
    else:
        click.echo(result.text)
    tps = result.completion_tokens / result.decode_s if result.decode_s > 0 else float("nan")
    note = f", {result.evicted_prompt_tokens} prompt tokens evicted" if result.evicted_prompt_tokens else ""
    if budget is not None and result.budgets:
        note += f", attention budget {result.budgets[-1]} rows (window {result.windows[-1]})"
    click.echo(f"[{result.prompt_tokens} prompt + {result.completion_tokens} tokens, {result.finish_reason}, "
               f"{tps:.1f} tokens/s{note}]", err=True)
    if not result.text and result.finish_reason == "stop":
        click.echo(_EMPTY_HINT["raw" if raw else "stop"], err=True)


_EMPTY_HINT = {
    "raw": "note: the model ended at once (an end token or a stop string came first); an instruct model expects "
           "its chat template: try without --raw",
    "stop": "note: the model ended at once (an end token or a stop string came first)",
}


def _as_chat(source, codec, raw: bool):
    """A plain --prompt as one user message when the bundle's tokenizer has a chat template (unless --raw)."""
    if isinstance(source, str) and not raw and codec is not None and codec.chat_template:
        return [{"role": "user", "content": source}]
    return source
