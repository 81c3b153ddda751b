"""`edgeattn export MODEL --decoder`: a rotary causal LM -> a decoder ONNX with a sinks + ring KV cache.

The families it takes, and why it refuses others, are in `edgeattn.decoder.families`.

Inputs (the names onnxruntime-genai uses where the meaning is the same): `input_ids` [B, S] int64,
`cache_position` [B] int64 (tokens already in each stream), `attention_window` int64 scalar (0 = the whole
ring), `past_key_values.{i}.key|value` [B, H_kv, C, D] (C = sinks + the ring, chosen by the runtime).
Outputs: `logits` [B, S, V], `present.{i}.key|value` [B, H_kv, S, D]: the chunk's rows, which the runtime
writes into its ring in place (no step copies the cache). With a page size (`page`, the attention budget) the
model also reads `attention_pages` (int64 scalar: retrieval pages k, 0 = the window alone) and per layer
`key_bounds.{i}` [B, H_kv, P, 2, D] (P = ring / page), which the runtime keeps beside its cache. The tokenizer, its chat template and the cache
geometry travel in the model's metadata, so a bundle built from it can generate on its own.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from edgeattn import atomic
from edgeattn.decoder import families
from edgeattn.errors import ConfigError, ModelError
from edgeattn.optional import require

from edgeattn.decoder.metadata import (DECODER_KEY, PAGES_INPUT, POSITION_INPUT, TOKENIZER_KEY, WINDOW_INPUT,
                                       bounds_names, past_names, present_names)

Progress = Callable[[str, float | None], None] | None  # (stage, estimated seconds or None)


@dataclass(frozen=True)
class DecoderExportConfig:
    sinks: int = 4  # first tokens kept forever (StreamingLLM: 4 restore quality past the window)
    window_max: int = 2048  # the ring the runtime allocates by default (it may choose another size)
    opset: int = 18
    example_seq: int = 8  # example chunk while tracing
    page: int = 0  # rows per retrieval page of the attention budget (16: Quest's); 0: a model without pages
    dense_layers: int = 0  # with pages: the first N layers read the whole ring when a budget reads pages (Quest: 2)

    def __post_init__(self) -> None:
        if self.sinks < 0:
            raise ConfigError(f"sinks: expected >= 0, found {self.sinks}")
        if self.window_max < 16:
            raise ConfigError(f"window_max: expected >= 16, found {self.window_max}")
        if self.page < 0 or (self.page and self.window_max % self.page):
            raise ConfigError(f"page: expected 0 (no retrieval pages) or a divisor of window_max "
                              f"{self.window_max}, found {self.page}")
        if self.dense_layers < 0 or (self.dense_layers and not self.page):
            raise ConfigError(f"dense_layers: expected 0, or layers read whole under a budget with a page size, "
                              f"found {self.dense_layers} with page {self.page}")
        if not 18 <= self.opset <= 23:
            raise ConfigError(f"opset: the cached op's body needs 18 to 23, found {self.opset}")


def decoder_metadata(model, tokenizer, config: DecoderExportConfig) -> dict[str, str]:
    c = families.text_config(model.config)
    eos = c.eos_token_id if isinstance(c.eos_token_id, list) else [c.eos_token_id]
    eos = sorted({int(e) for e in eos if e is not None} | ({int(tokenizer.eos_token_id)} if tokenizer.eos_token_id
                                                             is not None else set()))
    info = {
        "format": 1, "model_type": c.model_type, "layers": c.num_hidden_layers,
        "heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads,
        "head_dim": int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads),
        "vocab_size": c.vocab_size,
        "max_positions": int(getattr(c, "max_position_embeddings", 0) or 0),
        "sinks": config.sinks, "window_max": config.window_max, "page": config.page,
        "dense_layers": config.dense_layers,
        "eos_token_ids": eos, "bos_token_id": tokenizer.bos_token_id,
        "add_bos": bool(getattr(tokenizer, "add_bos_token", False)),
        "trained_sliding_window": max((w for w in families.layer_windows(c) if w), default=None),
        "layer_windows": list(families.layer_windows(c)),  # per layer: its trained window (None: full)
        "dtype": "float32",
        "special_tokens": {k: getattr(tokenizer, k, None) for k in ("bos_token", "eos_token", "pad_token")},
        "chat_template": getattr(tokenizer, "chat_template", None) or None,
    }
    meta = {DECODER_KEY: json.dumps(info)}
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None:
        raise ModelError("decoder export: expected a fast (tokenizers) tokenizer, found a slow one")
    meta[TOKENIZER_KEY] = backend.to_str()
    return meta


def export_decoder(name_or_dir: str | Path, out: str | Path, config: DecoderExportConfig = DecoderExportConfig(),
                   progress: Progress = None) -> Path:
    """Load a packaged alias or a Hugging Face folder and write the decoder ONNX to `out`, atomically.
    `progress(stage, seconds)`: told each stage as it starts, with an estimate of its length (or None)."""
    from edgeattn import hf_models

    progress = progress or (lambda stage, seconds: None)
    progress("loading", None)
    reason = families.why_not(hf_models.load_config(name_or_dir))
    if reason:
        raise ModelError(f"--decoder: {reason} ({name_or_dir})")
    model, tokenizer, _ = hf_models.load(name_or_dir, kind="decoder")  # attention is ours: any implementation
    return export_decoder_model(model, tokenizer, out, config, progress)


def effective_config(model_config, config: DecoderExportConfig) -> DecoderExportConfig:
    """The export's geometry for this model. Layers trained with a sliding window read exactly their window, so
    no sinks; when every layer has the same window (Mistral-style) the ring is that window."""
    windows = families.layer_windows(model_config)
    if not any(windows):
        return config
    ring = windows[0] if len(set(windows)) == 1 else config.window_max
    return DecoderExportConfig(**{**asdict(config), "window_max": int(ring), "sinks": 0})


# tracing and exporting on the 2-core development host: a 2-layer model ~40 s, SmolLM2-135M (30 layers) ~2.5 min
SECONDS_FIXED, SECONDS_PER_LAYER = 30.0, 5.0


def estimate_seconds(model_config) -> float:
    """A rough length of tracing and exporting: it grows with the layer count, hardly with their width."""
    return SECONDS_FIXED + SECONDS_PER_LAYER * int(families.text_config(model_config).num_hidden_layers)


def export_decoder_model(model, tokenizer, out: str | Path,
                         config: DecoderExportConfig = DecoderExportConfig(), progress: Progress = None) -> Path:
    """Export a loaded Hugging Face causal LM and its (fast) tokenizer."""
    torch = require("torch", "decoder export")
    from edgeattn.decoder.cached_llama import CachedDecoder

    progress = progress or (lambda stage, seconds: None)
    config = effective_config(model.config, config)
    wrapper = CachedDecoder(model, config.sinks, config.page, config.dense_layers).eval()
    layers = len(wrapper.layers)
    b, s, cap = 2, config.example_seq, config.sinks + 32  # not 1: torch.export specialises dims of size 1
    ids = torch.randint(0, min(1000, int(families.text_config(model.config).vocab_size)), (b, s), dtype=torch.int64)
    past = [torch.zeros(b, wrapper.kv_heads, cap, wrapper.head_dim) for _ in range(2 * layers)]
    args = (ids, torch.zeros(b, dtype=torch.int64), torch.tensor(0, dtype=torch.int64))
    names = ["input_ids", POSITION_INPUT, WINDOW_INPUT]
    outputs = ["logits", *present_names(layers)]
    batch, seq, cache, npages = (torch.export.Dim(n) for n in ("batch", "seq", "cache", "pages"))
    rest = ({0: batch, 2: cache},) * (2 * layers)  # forward's *rest: one entry (pages, the cache, the bounds)
    bounds = []
    if config.page:  # P >= 2 in the example (a dim of size 1 would be specialised; the op is symbolic here)
        bounds = [torch.zeros(b, wrapper.kv_heads, max(32 // config.page, 2), 2, wrapper.head_dim)
                  for _ in range(layers)]
        args, names = args + (torch.tensor(0, dtype=torch.int64),), names + [PAGES_INPUT]
        rest = (None, *rest) + ({0: batch, 2: npages},) * layers
    args, names = args + (*past, *bounds), names + past_names(layers) + bounds_names(layers)[:len(bounds)]
    dynamic = ({0: batch, 1: seq}, {0: batch}, None, rest)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".onnx", dir=out.parent)
    os.close(fd)
    try:
        progress("tracing and exporting", estimate_seconds(model.config))
        with torch.no_grad():
            program = torch.onnx.export(wrapper, args, dynamo=True, opset_version=config.opset,
                                        input_names=names, output_names=outputs, dynamic_shapes=dynamic,
                                        optimize=True, verbose=False)
        progress("saving", None)
        program.save(tmp)
        _finish(tmp, decoder_metadata(model, tokenizer, config), budget=bool(config.page))
        atomic.publish(tmp, out)  # the umask's mode, not mkstemp's 0600
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"decoder export failed: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _finish(path: str, metadata: dict[str, str], budget: bool = False) -> None:
    """Attach the cached op's ONNX body (its form with the budget's inputs when `budget`) and the metadata."""
    import onnx
    from onnx import helper

    from edgeattn.attention import DOMAIN, OPSET_VERSION
    from edgeattn.attention.cached_function import CACHED_OP_TYPE, cached_function_proto
    from edgeattn.onnx_model import opset_of

    model = onnx.load(path, load_external_data=True)
    kept = [f for f in model.functions if not (f.domain == DOMAIN and f.name == CACHED_OP_TYPE)]
    del model.functions[:]
    model.functions.extend(kept + [cached_function_proto(opset_of(model), budget=budget)])
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, OPSET_VERSION))
    if model.ir_version < 9:
        model.ir_version = 9
    for key, value in metadata.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, path)
