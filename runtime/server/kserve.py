"""The Open Inference Protocol (KServe v2) wire format: JSON tensors and Triton's binary tensor extension.

Binary extension: a request or response body is a JSON header followed by raw little-endian tensor bytes;
the header's length is in `Inference-Header-Content-Length`, and each binary tensor says its size in
`parameters.binary_data_size`, in the order the tensors are listed.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field

import numpy as np

from edgeattn.errors import InputError

HEADER_LENGTH = "Inference-Header-Content-Length"
WINDOW_PARAMETER = "attention_window"  # response parameter: the window the request ran with (None: no window)
MAX_ELEMENTS = 1 << 31  # per input tensor; far above any bundle's range, far below int64 overflow

# numpy dtype name <-> KServe datatype
DATATYPES = {"bool": "BOOL", "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
             "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
             "float16": "FP16", "float32": "FP32", "float64": "FP64"}
NUMPY_OF = {v: k for k, v in DATATYPES.items()}


class ProtocolError(InputError):
    """A request the service cannot honour; `status` is the HTTP status it answers with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self):  # keeps the status when raised in a worker process (offload.py)
        return ProtocolError, (str(self), self.status)


def decode_json(raw: bytes | memoryview, what: str = "request body"):
    """json.loads that answers 400 for invalid, non-UTF-8 or too deeply nested JSON, and for integers longer
    than Python converts from text (4300 digits: sys.get_int_max_str_digits())."""
    try:
        return json.loads(bytes(raw))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"{what} is not valid JSON: {exc}") from None
    except ValueError:  # the integer digit limit, the only other ValueError of json.loads
        limit = sys.get_int_max_str_digits()
        raise ProtocolError(f"{what}: expected integers of at most {limit} digits, found a longer one") from None
    except RecursionError:
        raise ProtocolError(f"{what}: JSON nested too deeply: expected at most a few levels") from None


def datatype_of(dtype: str) -> str:
    if dtype not in DATATYPES:
        raise ProtocolError(f"dtype {dtype!r} has no KServe datatype: expected one of {sorted(DATATYPES)}", 500)
    return DATATYPES[dtype]


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool


@dataclass
class InferRequest:
    inputs: dict[str, np.ndarray]
    outputs: list[RequestedOutput] | None  # None: every output
    binary_output: bool = False  # for outputs not listed (the `binary_data_output` request parameter)
    id: str | None = None
    parameters: dict = field(default_factory=dict)


def _object(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError(f"{what}: expected a JSON object, found {type(value).__name__}")
    return value


def _short(value, chars: int = 80) -> str:
    text = str(value)
    return text if len(text) <= chars else f"{text[:chars]}..."


def _shape(value, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > 32 or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise ProtocolError(f"input {name!r}: expected 'shape' as a list of at most 32 non-negative integers, "
                            f"found {_short(value)}")
    count = math.prod(value)
    if count > MAX_ELEMENTS:  # the count itself may have more digits than str() converts
        raise ProtocolError(f"input {name!r}: shape {_short(value)} has more than {MAX_ELEMENTS} elements: "
                            f"expected at most {MAX_ELEMENTS}")
    return tuple(value)


_ALLOWED = {"b": {bool}, "i": {int}, "u": {int}, "f": {int, float}}  # JSON value types each kind accepts
_FOUND = {bool: "booleans", int: "integers", float: "numbers with a fraction (or Infinity, NaN)", str: "strings",
          type(None): "nulls", list: "nested lists (expected a flat, row-major list)",
          dict: "objects (expected a flat, row-major list)"}


def _from_json(values, dtype: np.dtype, name: str, datatype: str) -> np.ndarray:
    """A flat JSON list as `dtype`, refusing what would be silently coerced (1.7 -> 1, "1" -> 1, 2**64)."""
    if not isinstance(values, list):
        raise ProtocolError(f"input {name!r}: expected 'data' as a flat list of values, found "
                            f"{type(values).__name__}")
    found = set(map(type, values))  # one pass, C speed: 0.7 s for 7.5 million values
    wrong = found - _ALLOWED[dtype.kind]
    if wrong:
        kinds = ", ".join(sorted(_FOUND.get(t, t.__name__) for t in wrong))
        raise ProtocolError(f"input {name!r}: expected {datatype} data, found {kinds}")
    try:
        array = np.asarray(values, dtype=dtype if dtype.kind != "f" else np.float64)
    except OverflowError:
        if dtype.kind in "iu":
            low, high = int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)
        else:
            high = float(np.finfo(np.float64).max)
            low = -high
        bad = next((v for v in values if not low <= v <= high), "?")
        raise ProtocolError(f"input {name!r}: {datatype} holds {low}..{high}, found {str(bad)[:40]}") from None
    if dtype.kind != "f":
        return array
    with np.errstate(over="ignore"):
        narrowed = array.astype(dtype)
    overflow = np.isinf(narrowed) & np.isfinite(array)
    if overflow.any():
        raise ProtocolError(f"input {name!r}: {datatype} holds at most {float(np.finfo(dtype).max):g} in "
                            f"magnitude, found {array[overflow][0]:g}")
    return narrowed


def _tensor(entry: dict, binary: memoryview, offset: int) -> tuple[str, np.ndarray, int]:
    name = entry.get("name")
    if not isinstance(name, str):
        raise ProtocolError(f"every input needs a string 'name', found {name!r}")
    shape = _shape(entry.get("shape"), name)
    datatype = entry.get("datatype")
    if not isinstance(datatype, str) or datatype not in NUMPY_OF:
        raise ProtocolError(f"input {name!r}: datatype {datatype!r} is not supported: expected one of "
                            f"{', '.join(sorted(NUMPY_OF))}")
    dtype = np.dtype(NUMPY_OF[datatype])
    count = math.prod(shape)
    params = _object(entry.get("parameters", {}), f"input {name!r} parameters")
    size = params.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ProtocolError(f"input {name!r}: binary_data_size must be a non-negative integer, found {size!r}")
        if size != count * dtype.itemsize:
            raise ProtocolError(f"input {name!r}: binary_data_size {size} does not match shape {list(shape)} of "
                                f"{datatype}: expected {count * dtype.itemsize} bytes")
        if offset + size > len(binary):
            raise ProtocolError(f"input {name!r}: expected {size} bytes of binary data, found "
                                f"{len(binary) - offset}")
        array = np.frombuffer(binary[offset:offset + size], dtype=dtype.newbyteorder("<")).astype(dtype)
        return name, array.reshape(shape), offset + size
    if "data" not in entry:
        raise ProtocolError(f"input {name!r}: expected 'data' or a binary_data_size parameter")
    array = _from_json(entry["data"], dtype, name, datatype)
    if array.size != count:
        raise ProtocolError(f"input {name!r}: shape {list(shape)} needs {count} values, found {array.size}")
    return name, array.reshape(shape), offset


def parse_request(body: bytes, header_length: str | None) -> InferRequest:
    """Decode an infer request body; every defect is a ProtocolError (400) that says what was wrong."""
    if header_length is None:
        head, binary = body, memoryview(b"")
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise ProtocolError(f"{HEADER_LENGTH}: expected an integer, found {header_length!r}") from None
        if not 0 <= n <= len(body):
            raise ProtocolError(f"{HEADER_LENGTH} {n} is outside the body of {len(body)} bytes")
        head, binary = body[:n], memoryview(body)[n:]
    doc = _object(decode_json(head), "request")
    entries = doc.get("inputs")
    if not isinstance(entries, list) or not entries:
        raise ProtocolError("request: expected a non-empty 'inputs' list")
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for entry in entries:
        name, array, offset = _tensor(_object(entry, "input"), binary, offset)
        if name in inputs:
            raise ProtocolError(f"input {name!r} is given twice")
        inputs[name] = array
    if offset != len(binary):
        raise ProtocolError(f"binary data: the inputs account for {offset} bytes, found {len(binary)}")
    params = _object(doc.get("parameters", {}), "request parameters")
    if WINDOW_PARAMETER in params:
        raise ProtocolError(f"request parameter {WINDOW_PARAMETER!r}: the attention window is the server's, set for "
                            f"all requests: leave it out (change it with POST /v2/admin/window)")
    outputs = None
    if "outputs" in doc:
        if not isinstance(doc["outputs"], list):
            raise ProtocolError("request: 'outputs' must be a list")
        outputs = []
        for out in doc["outputs"]:
            out = _object(out, "requested output")
            if not isinstance(out.get("name"), str):
                raise ProtocolError(f"requested output: expected a string 'name', found {out.get('name')!r}")
            oparams = _object(out.get("parameters", {}), f"output {out['name']!r} parameters")
            outputs.append(RequestedOutput(out["name"], bool(oparams.get("binary_data", False))))
    request_id = doc.get("id")
    return InferRequest(inputs, outputs, bool(params.get("binary_data_output", False)),
                        None if request_id is None else str(request_id), params)


def encode_response(model: str, version: str, request: InferRequest, outputs: dict[str, np.ndarray],
                    parameters: dict) -> tuple[bytes, dict[str, str]]:
    """The response body and its extra headers: JSON, or JSON header + binary tensors."""
    wanted = request.outputs or [RequestedOutput(n, request.binary_output) for n in outputs]
    entries, chunks = [], []
    for want in wanted:
        array = np.ascontiguousarray(outputs[want.name])
        entry = {"name": want.name, "datatype": datatype_of(array.dtype.name), "shape": list(array.shape)}
        if want.binary:
            raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = array.ravel().tolist()
        entries.append(entry)
    doc = {"model_name": model, "model_version": version, "parameters": parameters, "outputs": entries}
    if request.id is not None:
        doc["id"] = request.id
    head = json.dumps(doc).encode()
    if not chunks:
        return head, {"Content-Type": "application/json"}
    return head + b"".join(chunks), {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(head))}
