"""Weight-only int4 for a decoder ONNX: every MatMul with a constant weight becomes a MatMulNBits.

The scheme is onnxruntime-genai's int4 on the CPU: round to nearest, blocks of 32 along the input
dimension, symmetric (int4, no zero points), and accuracy level 4 (ONNX Runtime quantizes the activations to
int8 inside the kernel). Activations, the KV cache and the cached attention op stay float32; only the bytes
of the weights shrink (about 7x for the projections and the LM head).

The choice is recorded in the model's metadata (`edgeattn.weight_only`) and in the decoder's own section
(`weights`), so a bundle built from it says so in its manifest and in generation.json.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from edgeattn import atomic
from edgeattn.errors import ConfigError, ModelError

from edgeattn.decoder.metadata import DECODER_KEY

WEIGHT_ONLY_KEY = "edgeattn.weight_only"  # JSON: the WeightOnlyConfig and how many MatMuls it changed


@dataclass(frozen=True)
class WeightOnlyConfig:
    bits: int = 4
    block: int = 32  # weights per scale, along the input dimension
    symmetric: bool = True  # int4 with no zero points (onnxruntime-genai's default)
    accuracy_level: int = 4  # MatMulNBits: 4 = int8 activations in the kernel, 1 = float32
    method: str = "rtn"

    def __post_init__(self) -> None:
        if self.bits != 4:
            raise ConfigError(f"bits: expected 4, found {self.bits!r}")
        if isinstance(self.block, bool) or self.block not in (16, 32, 64, 128, 256):
            raise ConfigError(f"block: expected 16, 32, 64, 128 or 256, found {self.block!r}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ConfigError(f"accuracy_level: expected 0 to 4, found {self.accuracy_level!r}")
        if self.method != "rtn":
            raise ConfigError(f"method: expected rtn, found {self.method!r}")


def quantize_weights_int4(src: str | Path, dst: str | Path, block: int = 32, *,
                          config: WeightOnlyConfig | None = None) -> Path:
    """Read the ONNX model `src`, write its int4 weight-only form to `dst` (atomically); returns `dst`."""
    import onnx

    config = config or WeightOnlyConfig(block=block)
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise ConfigError(f"dst: expected a path other than the source model, found {dst}")
    model = onnx.load(str(src), load_external_data=True)
    meta = {p.key: p.value for p in model.metadata_props}
    if WEIGHT_ONLY_KEY in meta:
        raise ModelError(f"{src}: its weights are already quantized ({meta[WEIGHT_ONLY_KEY]})")
    quantized = quantize_model_int4(model, config)
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".onnx", dir=dst.parent)
    os.close(fd)
    try:
        onnx.save(quantized, tmp)
        atomic.publish(tmp, dst)  # the umask's mode, not mkstemp's 0600
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dst


def quantize_model_int4(model, config: WeightOnlyConfig = WeightOnlyConfig()):
    """A ModelProto -> a new ModelProto with MatMulNBits weights and the metadata that says so."""
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)  # a line per node
    model = _fold_weight_transposes(model)
    before = sum(1 for n in model.graph.node if n.op_type == "MatMul")
    quantizer = MatMulNBitsQuantizer(model, bits=config.bits, block_size=config.block,
                                     is_symmetric=config.symmetric, accuracy_level=config.accuracy_level,
                                     op_types_to_quantize=("MatMul",))
    quantizer.process()
    out = quantizer.model.model
    changed = sum(1 for n in out.graph.node if n.op_type == "MatMulNBits")
    if changed == 0:
        raise ModelError(f"int4 weights: expected MatMuls with constant weights, found none among {before} "
                         "MatMul nodes (weights as graph inputs, or already quantized)")
    record = {**asdict(config), "matmuls": changed, "matmuls_left_float": before - changed}
    _set_metadata(out, WEIGHT_ONLY_KEY, json.dumps(record))
    meta = {p.key: p.value for p in out.metadata_props}
    if DECODER_KEY in meta:  # the decoder's section travels into the bundle (manifest, generation.json)
        info = json.loads(meta[DECODER_KEY])
        info["weights"] = f"int{config.bits} weight-only ({config.method}, block {config.block}, " \
                          f"{'symmetric' if config.symmetric else 'asymmetric'})"
        _set_metadata(out, DECODER_KEY, json.dumps(info))
    return out


def _fold_weight_transposes(model):
    """A copy where MatMul(x, Transpose(W)) reads a transposed copy of the constant W instead.

    A tied LM head reaches its MatMul through a Transpose of the embedding table (which the Gather still
    reads in float); the quantizer only takes constant weights, so the head gets its own [in, out] constant
    and will be quantized like the other projections (as onnxruntime-genai does)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    dropped = []
    for node in graph.node:
        perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
        if node.op_type != "Transpose" or node.input[0] not in inits or perm not in ([[1, 0]], []):
            continue
        users = readers.get(node.output[0], [])
        if not users or not all(u.op_type == "MatMul" and list(u.input).index(node.output[0]) == 1 for u in users):
            continue
        weight = numpy_helper.to_array(inits[node.input[0]])
        if weight.ndim != 2:
            continue
        graph.initializer.append(numpy_helper.from_array(weight.T.copy(), node.output[0]))
        dropped.append(node)
    for node in dropped:
        graph.node.remove(node)
    return model


def weight_only_info(model) -> dict | None:
    """The recorded weight-only scheme of a ModelProto, or None for float weights."""
    for p in model.metadata_props:
        if p.key == WEIGHT_ONLY_KEY:
            return json.loads(p.value)
    return None


def _set_metadata(model, key: str, value: str) -> None:
    for p in model.metadata_props:
        if p.key == key:
            p.value = value
            return
    model.metadata_props.add(key=key, value=value)
