"""Export a PyTorch / Hugging Face model to ONNX with named inputs, outputs and dynamic axes."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from edgeattn import atomic
from edgeattn.errors import ConfigError, ModelError
from edgeattn.optional import require

EXPORTERS = ("dynamo", "torchscript")


@dataclass(frozen=True)
class ExportConfig:
    exporter: str = "dynamo"  # dynamo (torch.export) or torchscript (the legacy tracer)
    opset: int = 18
    batch: int = 2  # example batch used while tracing
    seq_len: int = 16  # example sequence length used while tracing
    attention: str = "native"  # native: the model's own attention; windowed: edgeattn::WindowedAttention
    sinks: int = 0  # windowed: the first `sinks` tokens are always attended

    def __post_init__(self) -> None:
        if self.exporter not in EXPORTERS:
            raise ConfigError(f"exporter: expected one of {', '.join(EXPORTERS)}, found {self.exporter!r}")
        if not 13 <= self.opset <= 23:
            raise ConfigError(f"opset: expected 13 to 23, found {self.opset}")
        if self.attention not in ("native", "windowed"):
            raise ConfigError(f"attention: expected native or windowed, found {self.attention!r}")
        if self.attention == "windowed" and self.exporter != "dynamo":
            raise ConfigError("attention='windowed' needs the dynamo exporter (the TorchScript exporter cannot "
                              "emit the custom op; export natively and let `edgeattn build` fuse it)")
        if self.attention == "windowed" and self.opset < 18:
            raise ConfigError(f"attention='windowed' needs opset >= 18, found {self.opset}")
        if self.sinks < 0:
            raise ConfigError(f"sinks: expected >= 0, found {self.sinks}")
        if self.batch < 1 or self.seq_len < 2:
            raise ConfigError(f"example shape: expected batch >= 1 and seq_len >= 2, found {self.batch}x{self.seq_len}")


WINDOW_INPUT = "attention_window"  # int64 scalar graph input of windowed exports (0 = full)


def export_wrapper(model, kind: str):
    """A module with plain tensor inputs and one named output: last_hidden_state or logits."""
    torch = require("torch")

    class Encoder(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    class Decoder(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits

    return (Decoder if kind == "decoder" else Encoder)(model).eval(), ("logits" if kind == "decoder" else "last_hidden_state")


def _windowed_wrapper(model, kind: str):
    """Like export_wrapper, with a third input: the attention window, handed to every attention layer."""
    torch = require("torch")
    from edgeattn.attention.hf_attention import WINDOW_KWARG

    class Windowed(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, attention_window):
            extra = {"use_cache": False} if kind == "decoder" else {}
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask, **extra,
                             **{WINDOW_KWARG: attention_window})
            return out.logits if kind == "decoder" else out.last_hidden_state

    return Windowed(model).eval(), ("logits" if kind == "decoder" else "last_hidden_state")


def export_module(model, kind: str, out: str | Path, config: ExportConfig = ExportConfig()) -> Path:
    """Export a loaded Hugging Face model (encoder or causal LM) to `out`, atomically."""
    torch = require("torch", "ONNX export")
    out = Path(out)
    ids = torch.randint(0, 1000, (config.batch, config.seq_len), dtype=torch.int64)
    mask = torch.ones_like(ids)
    dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    if config.attention == "windowed":
        from edgeattn.attention.hf_attention import use_windowed_attention

        use_windowed_attention(model, sinks=config.sinks)
        wrapper, output_name = _windowed_wrapper(model, kind)
        args, names = (ids, mask, torch.tensor(0, dtype=torch.int64)), ["input_ids", "attention_mask", WINDOW_INPUT]
        dynamic[WINDOW_INPUT] = {}
    else:
        wrapper, output_name = export_wrapper(model, kind)
        args, names = (ids, mask), ["input_ids", "attention_mask"]
    dynamic[output_name] = {0: "batch", 1: "seq"}
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".onnx", dir=out.parent)
    os.close(fd)
    try:
        with torch.no_grad():
            if config.exporter == "dynamo":
                program = torch.onnx.export(wrapper, args, dynamo=True, opset_version=config.opset,
                                            input_names=names,
                                            output_names=[output_name], dynamic_axes=dynamic,
                                            optimize=True, verbose=False)
                program.save(tmp)
                if config.attention == "windowed":
                    _attach_windowed_function(tmp)
            else:
                torch.onnx.export(wrapper, args, tmp, dynamo=False, opset_version=config.opset,
                                  input_names=names, output_names=[output_name],
                                  dynamic_axes=dynamic)
        atomic.publish(tmp, out)  # the umask's mode, not mkstemp's 0600
    except Exception as exc:
        if isinstance(exc, ModelError):
            raise
        raise ModelError(f"export with the {config.exporter} exporter failed: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _attach_windowed_function(path: str) -> None:
    """The dynamo exporter keeps the custom node; add the op's ONNX body so ONNX Runtime can run it."""
    import onnx

    from edgeattn.attention.onnx_node import attach_function

    model = onnx.load(path, load_external_data=True)
    attach_function(model)
    onnx.save(model, path)


def export_hf(name_or_dir: str | Path, out: str | Path, config: ExportConfig = ExportConfig()) -> Path:
    """Load a packaged alias or a Hugging Face folder and export it."""
    from edgeattn import hf_models

    model, _, kind = hf_models.load(name_or_dir)
    return export_module(model, kind, out, config)
