"""The fast path of a cpu decoder bundle: its `linear_model` (edgeattn.bundle.build._linear_form).

While a stream has not left its window (every position so far p < sinks + W, so the ring has not wrapped and
the sinks' second rotation is the first one), the cached attention is plain causal attention over rows
[0, t) of the stream's buffers. The linear model runs it as ONNX Runtime's GroupQueryAttention reading those
buffers directly, with its present outputs bound to the same memory: the op writes the chunk's keys and
values into the ring in place, nothing is gathered or copied, and the host has nothing to write. Every other
step (a stream past its window, streams that are not consecutive rows of the cache) runs the ring graph.
"""

from __future__ import annotations

import numpy as np

from edgeattn.decoder.metadata import LOGITS_TO_KEEP


def eligible(sinks: int, window_max: int, positions: np.ndarray, chunk: int, window: int) -> bool:
    """Whether every stream's chunk ends inside its live window (window 0: the whole ring)."""
    live = window_max if window == 0 else min(window, window_max)
    return bool(positions.size) and int(positions.max()) + chunk <= sinks + live


class LinearPath:
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

    def _binding(self, cache, first: int, count: int):
        """One IO binding per (cache, streams): the buffers' memory bound once as past inputs and present outputs."""
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
            cache.bindings[key] = (io, held)
        return cache.bindings[key][0]

    def step(self, cache, first: int, ids: np.ndarray, window: int, last_only: bool) -> np.ndarray:
        """ids [n, S] for streams first .. first + n - 1 -> logits; their buffers are written in place."""
        count = ids.shape[0]
        io = self._binding(cache, first, count)
        io.bind_cpu_input("input_ids", ids)
        io.bind_cpu_input("cache_position", cache.positions[first:first + count].copy())
        if "attention_window" in self.inputs:
            io.bind_cpu_input("attention_window", np.array(window, dtype=np.int64))
        if LOGITS_TO_KEEP in self.inputs:
            io.bind_cpu_input(LOGITS_TO_KEEP, np.array(1 if last_only else 0, dtype=np.int64))
        if self._logits_dim is None:
            io.bind_output("logits")  # binding the name again replaces it (it stays after the buffers)
            self.session.run_with_iobinding(io)
            logits = io.get_outputs()[-1].numpy()
        else:
            import onnxruntime as ort

            rows = 1 if last_only and LOGITS_TO_KEEP in self.inputs else ids.shape[1]  # what the graph returns
            logits = np.empty((count, rows, self._logits_dim), np.float32)
            io.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
            self.session.run_with_iobinding(io)
        cache.positions[first:first + count] += ids.shape[1]
        return logits
