"""What a decoder ONNX carries besides its graph, and the names of its cache inputs and outputs.

Light on purpose (no torch): the build and the runtime read it too."""

from __future__ import annotations

import json
from pathlib import Path

DECODER_KEY = "edgeattn.decoder"  # JSON: the cache geometry, special tokens, chat template
TOKENIZER_KEY = "edgeattn.tokenizer"  # tokenizer.json (the `tokenizers` format)
WINDOW_INPUT = "attention_window"
POSITION_INPUT = "cache_position"
PAGES_INPUT = "attention_pages"  # the attention budget's retrieval pages k (a model exported with a page size)
LOGITS_TO_KEEP = "logits_to_keep"  # added by the cpu build (edgeattn.passes.logits_to_keep): 1 = last position only
GENERATION_FILE = "generation.json"  # in a bundle: DECODER_KEY's JSON
TOKENIZER_FILE = "tokenizer.json"


def past_names(layers: int) -> list[str]:
    return [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def bounds_names(layers: int) -> list[str]:
    """The attention budget's key bounds inputs, [B, H_kv, P, 2, D] per layer."""
    return [f"key_bounds.{i}" for i in range(layers)]


def present_names(layers: int) -> list[str]:
    return [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def write_bundle_files(metadata: dict[str, str], folder: Path) -> tuple[list[str], dict | None]:
    """For a decoder model: write generation.json and tokenizer.json into a bundle being built.
    Returns (file names, the geometry for the manifest's `decoder` section); ([], None) for other models."""
    if DECODER_KEY not in metadata:
        return [], None
    info = json.loads(metadata[DECODER_KEY])
    (folder / GENERATION_FILE).write_text(json.dumps(info, indent=1), encoding="utf-8")
    names = [GENERATION_FILE]
    if TOKENIZER_KEY in metadata:
        (folder / TOKENIZER_FILE).write_text(metadata[TOKENIZER_KEY], encoding="utf-8")
        names.append(TOKENIZER_FILE)
    section = {k: v for k, v in info.items() if k != "chat_template"}
    section["tokenizer"] = TOKENIZER_KEY in metadata
    return names, section
