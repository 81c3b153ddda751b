"""TensorRT backend, shared by TensorRT for RTX (rtx bundles) and TensorRT (orin / thor / h100 bundles).

Lifecycle: `activate` checks for a CUDA device BEFORE any TensorRT object exists (a runtime without CUDA
logs error 35 and deserializing then crashes the whole process), deserializes the engine and makes a
context and a stream; `infer` picks the optimization profile that holds the input shapes, copies through
cuda-python device buffers (grown as needed) and replays a CUDA graph per shape set where the context
is capturable; `deactivate` frees everything. Not run on this project's machines: no GPU here, and the
lent H200 (sm_90) has no TensorRT and refuses TensorRT for RTX engines.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgeattn.errors import InputError, RuntimeBackendError

LIBRARIES = {"tensorrt_rtx": "TensorRT for RTX", "tensorrt": "TensorRT"}


def _cudart():
    from edgeattn.optional import require

    return require("cuda.bindings.runtime", "the TensorRT runtime backend")


def _ok(result, what: str):
    """cuda-python calls return (error, *values): raise on error, return the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeBackendError(f"CUDA {what} failed: {err}")
    return values[0] if len(values) == 1 else values


def cuda_device() -> tuple[int, int] | None:
    """(major, minor) of device 0, or None when there is no usable CUDA device (driver calls only)."""
    try:
        cudart = _cudart()
        err, count = cudart.cudaGetDeviceCount()
        if int(err) != 0 or not count:
            return None
        err, props = cudart.cudaGetDeviceProperties(0)
        return (props.major, props.minor) if int(err) == 0 else None
    except Exception:  # cuda-python missing or no driver
        return None


class TensorRTBackend:
    """Runs a serialized TensorRT / TensorRT for RTX engine."""

    def __init__(self, engine_path: str | Path, *, library: str = "tensorrt_rtx",
                 compute_capabilities: tuple[int, ...] = (), plugin: bool = False, cuda_graphs: bool = True) -> None:
        if library not in LIBRARIES:
            raise RuntimeBackendError(f"library: expected one of {', '.join(LIBRARIES)}, found {library!r}")
        self.name = library
        self.engine_path = Path(engine_path)
        self.compute_capabilities = compute_capabilities  # SMs the engine was built for (empty: not known)
        self.plugin = plugin  # the engine holds the edgeattn WindowedAttention plugin
        self.cuda_graphs = cuda_graphs
        self.graph_notes: dict[tuple, str] = {}  # shape set -> why it runs without a CUDA graph
        self._engine = self._context = self._stream = None
        self._buffers: dict[str, tuple[int, int]] = {}  # tensor -> (device pointer, bytes)
        self._graphs: dict[tuple, object] = {}
        self._profile = -1

    # lifecycle
    def activate(self) -> None:
        device = cuda_device()
        if device is None:
            raise RuntimeBackendError(f"no CUDA device: {LIBRARIES[self.name]} engines need an NVIDIA GPU and "
                                      "driver (nothing was loaded: a CUDA-less runtime can crash the process)")
        sm = device[0] * 10 + device[1]
        if self.compute_capabilities and sm not in self.compute_capabilities:
            raise RuntimeBackendError(f"{self.engine_path.name} was built for SM{', SM'.join(map(str, self.compute_capabilities))}, "
                                      f"found a GPU with SM{sm}")
        from edgeattn.engines.tensorrt.adapter import flavor

        trt = flavor(self.name).load()
        if self.plugin:
            from edgeattn.plugins.tensorrt.rtx import register

            register(trt)
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        engine = self._runtime.deserialize_cuda_engine(self.engine_path.read_bytes())
        if engine is None:
            raise RuntimeBackendError(f"{LIBRARIES[self.name]} could not deserialize {self.engine_path}")
        self._attach(trt, engine, engine.create_execution_context())

    def _attach(self, trt, engine, context) -> None:
        """Take a deserialized engine and its context: a stream, the I/O names."""
        self._trt, self._engine, self._context = trt, engine, context
        self._stream = _ok(_cudart().cudaStreamCreate(), "stream creation")
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.input_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if n not in self.input_names]

    def deactivate(self) -> None:
        if self._stream is None:
            return
        cudart = _cudart()
        for graph in self._graphs.values():
            cudart.cudaGraphExecDestroy(graph)
        for ptr, _ in self._buffers.values():
            cudart.cudaFree(ptr)
        cudart.cudaStreamDestroy(self._stream)
        self._graphs, self._buffers = {}, {}
        self._engine = self._context = self._stream = None

    def __enter__(self) -> "TensorRTBackend":
        self.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.deactivate()

    # running
    def _pick_profile(self, shapes: dict[str, tuple[int, ...]]) -> int:
        for p in range(self._engine.num_optimization_profiles):
            fits = True
            for name, shape in shapes.items():
                if not any(isinstance(d, int) and d < 0 for d in self._engine.get_tensor_shape(name)):
                    continue
                lo, _, hi = self._engine.get_tensor_profile_shape(name, p)
                fits &= all(a <= s <= b for a, s, b in zip(lo, shape, hi))
            if fits:
                return p
        raise InputError(f"input shapes {shapes} fit none of the engine's {self._engine.num_optimization_profiles} "
                         "optimization profiles (see the bundle's shape ranges)")

    def _buffer(self, name: str, nbytes: int) -> int:
        ptr, size = self._buffers.get(name, (0, 0))
        if size < nbytes:
            cudart = _cudart()
            if ptr:
                cudart.cudaFree(ptr)
            ptr = _ok(cudart.cudaMalloc(max(nbytes, 1)), f"allocation of {nbytes} bytes")
            self._buffers[name] = (ptr, nbytes)
            self._graphs.clear()  # captured graphs hold the old addresses
        return ptr

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._context is None:
            raise RuntimeBackendError("backend is not active: call activate() first")
        missing = set(self.input_names) - set(feeds)
        if missing:
            raise InputError(f"missing input(s) {sorted(missing)}: expected {self.input_names}")
        cudart, trt, ctx = _cudart(), self._trt, self._context
        arrays = {n: np.ascontiguousarray(feeds[n], dtype=trt.nptype(self._engine.get_tensor_dtype(n)))
                  for n in self.input_names}
        profile = self._pick_profile({n: a.shape for n, a in arrays.items()})
        if profile != self._profile:
            ctx.set_optimization_profile_async(profile, self._stream)
            self._profile, self._graphs = profile, {}
        h2d, d2h = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for name, array in arrays.items():
            ctx.set_input_shape(name, array.shape)
            ptr = self._buffer(name, array.nbytes)
            ctx.set_tensor_address(name, ptr)
            _ok(cudart.cudaMemcpyAsync(ptr, array.ctypes.data, array.nbytes, h2d, self._stream), "copy to device")
        outputs = {}
        for name in self.output_names:
            shape = tuple(ctx.get_tensor_shape(name))
            outputs[name] = np.empty(shape, dtype=trt.nptype(self._engine.get_tensor_dtype(name)))
            ctx.set_tensor_address(name, self._buffer(name, outputs[name].nbytes))
        self._execute(tuple((n, a.shape) for n, a in arrays.items()))
        for name, out in outputs.items():
            _ok(cudart.cudaMemcpyAsync(out.ctypes.data, self._buffers[name][0], out.nbytes, d2h, self._stream),
                "copy to host")
        _ok(cudart.cudaStreamSynchronize(self._stream), "stream synchronize")
        return outputs

    def _execute(self, key: tuple) -> None:
        """Replay the CUDA graph captured for these shapes, or run and try to capture one."""
        cudart = _cudart()
        if key in self._graphs:
            _ok(cudart.cudaGraphLaunch(self._graphs[key], self._stream), "graph launch")
            return
        if not self._context.execute_async_v3(self._stream):
            raise RuntimeBackendError(f"{LIBRARIES[self.name]} failed to run {self.engine_path.name}")
        if not self.cuda_graphs or key in self.graph_notes:
            return
        if not self._context.is_stream_capturable(self._stream):
            self.graph_notes[key] = "the context is not stream-capturable"
            return
        try:
            _ok(cudart.cudaStreamBeginCapture(self._stream, cudart.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal),
                "capture start")
            self._context.execute_async_v3(self._stream)
            graph = _ok(cudart.cudaStreamEndCapture(self._stream), "capture end")
            self._graphs[key] = _ok(cudart.cudaGraphInstantiate(graph, 0), "graph instantiation")
        except RuntimeBackendError as exc:  # e.g. a plugin that synchronizes: run uncaptured from now on
            self.graph_notes[key] = str(exc)
