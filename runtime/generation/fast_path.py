"""The fast path of a cpu decoder bundle: its `fast_path_model` (edgeattn.bundle.fast_path).

While a stream has not left its window (every position so far p < sinks + W, so the ring has not wrapped and
the sinks' second rotation is the first one), the cached attention is plain causal attention over rows
[0, t) of the stream's buffers. The fast path model runs it as ONNX Runtime's GroupQueryAttention reading those
buffers directly, with its present outputs bound to the same memory: the op writes the chunk's keys and
values into the ring in place, nothing is gathered or copied, and the host has nothing to write. Every other
step (a stream past its window, streams that are not consecutive rows of the cache) runs the ring graph.
"""

from __future__ import annotations

import numpy as np

from edgeattn.decoder.metadata import LOGITS_TO_KEEP


def eligible(sinks: int, window_max: int, positions: np.ndarray, chunk: int, window: int, limit: int = 0) -> bool:
    """Whether every stream's chunk ends inside its live window (window 0: the whole ring) and, when the fast
    path model's rotation tables end at `limit` positions (the manifest's `fast_path_positions`), before that."""
    live = window_max if window == 0 else min(window, window_max)
    end = sinks + live if not limit else min(sinks + live, limit)
    return bool(positions.size) and int(positions.max()) + chunk <= end


class FastPath:
    def __init__(self, model_path, *, threads: int, past: list[str], present: list[str]) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.session.get_inputs()} | \
            {i.name for i in self.session.get_overridable_initializers()}
        self.past, self.present = past, present
        logits = next(o for o in self.session.get_outputs() if o.name == "logits")
        self._logits_dim = logits.shape[-1] if logits.type == "tensor(float)" and isinstance(logits.shape[-1], int) \
            else None  # float32 logits of a known width: written into an array of ours (no output wrapping)

    def _binding(self, cache, first: int, count: int) -> "_Binding":
        """One binding per (cache, streams): the buffers' memory bound once as past inputs and present outputs."""
        import onnxruntime as ort

        key = (id(self), first, count)
        if key not in cache.bindings:
            for stale in [k for k in cache.bindings if k[0] != id(self)]:  # a session closed since (reactivated)
                del cache.bindings[stale]
            io = self.session.io_binding()
            held = []
            buffers = []
            for k, v in zip(cache.keys, cache.values):
                buffers += [k[first:first + count], v[first:first + count]]
            for past, present, buffer in zip(self.past, self.present, buffers):
                value = ort.OrtValue.ortvalue_from_numpy(buffer)  # the cache's own memory, not a copy
                io.bind_ortvalue_input(past, value)
                io.bind_ortvalue_output(present, value)
                held.append(value)
            cache.bindings[key] = _Binding(io, held, count, self.inputs)
        return cache.bindings[key]

    def step(self, cache, first: int, ids: np.ndarray, window: int, last_only: bool) -> np.ndarray:
        """ids [n, S] for streams first .. first + n - 1 -> logits; their buffers are written in place."""
        count, chunk = ids.shape
        binding = self._binding(cache, first, count)
        rows = 1 if last_only and LOGITS_TO_KEEP in self.inputs else chunk  # the logits rows the graph returns
        binding.bind_chunk(chunk, rows, self._logits_dim)
        binding.ids[...] = ids
        binding.positions[...] = cache.positions[first:first + count]
        binding.window[...] = window
        binding.keep[...] = 1 if last_only else 0
        self.session.run_with_iobinding(binding.io)
        cache.positions[first:first + count] += chunk
        if binding.logits is None:
            return binding.io.get_outputs()[-1].numpy()  # bound by name: a new array every run
        return binding.logits.copy()  # the bound array is written again by the next step: the caller gets its own


class _Binding:
    """What one (cache, streams) pair keeps bound: the cache buffers as past inputs and present outputs, and
    small arrays of ours as the other inputs and the logits output, bound once; a step writes into them in
    place instead of binding new values (a decode step at a short context is a few milliseconds, and binding
    five values took a tenth of a millisecond of it)."""

    def __init__(self, io, held: list, count: int, inputs: set[str]) -> None:
        import onnxruntime as ort

        self.io, self.held = io, held
        self.positions = np.zeros(count, np.int64)
        self.window = np.zeros((), np.int64)
        self.keep = np.zeros((), np.int64)
        for name, array in (("cache_position", self.positions), ("attention_window", self.window),
                            (LOGITS_TO_KEEP, self.keep)):
            if name in inputs:
                value = ort.OrtValue.ortvalue_from_numpy(array)
                io.bind_ortvalue_input(name, value)
                held.append(value)
        self.shape: tuple[int, int] | None = None  # (chunk, logits rows) that ids and logits are bound for
        self.ids = self.logits = None
        self.chunk_values: list = []

    def bind_chunk(self, chunk: int, rows: int, width: int | None) -> None:
        """ids [count, chunk] (and logits [count, rows, width] where the width is known), bound when the shape
        changes: once for a decode stream, once per prefill chunk length."""
        import onnxruntime as ort

        if self.shape == (chunk, rows):
            return
        count = self.positions.shape[0]
        self.ids = np.zeros((count, chunk), np.int64)
        self.chunk_values = [ort.OrtValue.ortvalue_from_numpy(self.ids)]
        self.io.bind_ortvalue_input("input_ids", self.chunk_values[0])
        if width is None:
            self.logits = None
            self.io.bind_output("logits")  # binding the name again replaces it (it stays after the buffers)
        else:
            self.logits = np.empty((count, rows, width), np.float32)
            self.chunk_values.append(ort.OrtValue.ortvalue_from_numpy(self.logits))
            self.io.bind_ortvalue_output("logits", self.chunk_values[1])
        self.shape = (chunk, rows)
