"""`edgeattn::WindowedAttention` as a Python IPluginV3 for TensorRT for RTX (and full TensorRT).

The ONNX parser maps a node `WindowedAttention` (domain `edgeattn`, attribute
`plugin_namespace="edgeattn"`) to this plugin. Building needs no GPU: the builder only asks the plugin
for output types, shapes and formats. The plugin classes subclass the bindings of whichever library is
passed in (`tensorrt_rtx` or `tensorrt`), so one definition serves both.

Run time (NOT run on this project's machines: TensorRT for RTX engines refuse the lent H200, sm_90):
`enqueue` wraps the device buffers as torch tensors and calls `torch.ops.edgeattn.windowed_attention`, or for
the cached form `run_cached` (the Triton kernels of edgeattn.plugins; with the attention budget's inputs, the
budget's kernels), which needs Python and torch in the serving process. `run_cached` itself is tested on CPU
tensors here and on CUDA tensors on an H200 (tests/test_rtx_budget.py).
Engines that must run without Python use the ahead-of-time `tensorrt.plugin` form instead.

Loading note: TensorRT for RTX resolves Python plugins through an unversioned `libtensorrt_rtx.so`,
which the wheel does not ship; `edgeattn.engines.tensorrt.adapter` makes the link and puts it on the
library path of the build subprocess.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np

PLUGIN_NAME = "WindowedAttention"
CACHED_PLUGIN_NAME = "CachedWindowedAttention"  # the cached form (decoders): edgeattn/attention/cached_function.py
PLUGIN_NAMESPACE = "edgeattn"
PLUGIN_VERSION = "1"
# attribute -> (numpy dtype, default); scale 0 means 1/sqrt(D) (docs/windowed-attention.md)
FIELDS: dict[str, tuple[type, float]] = {"causal": (np.int32, 1), "sinks": (np.int32, 0), "scale": (np.float32, 0.0)}
CACHED_FIELDS: dict[str, tuple[type, float]] = {"sinks": (np.int32, 0), "scale": (np.float32, 0.0)}


def _plain_formats(trt, pos, in_out, num_inputs) -> bool:
    """q, k, v, out: one float type; window: int scalar; key_padding_mask: bool or int."""
    desc = in_out[pos].desc
    if pos == 3:
        return desc.type in (trt.int64, trt.int32)
    if pos == 4 and num_inputs == 5:
        return desc.type in (trt.bool, trt.int64, trt.int32)
    return desc.type in (trt.float32, trt.float16, trt.bfloat16) and desc.type == in_out[0].desc.type


def _cached_formats(trt, pos, in_out, num_inputs) -> bool:
    """q, q_sink, k, v, past_key, past_value, out: one float type; cache_position, window: int64. The attention
    budget's form (10 inputs) adds pages (int64) and key_bounds (the float type)."""
    desc = in_out[pos].desc
    if pos in (6, 7) or (pos == 8 and num_inputs == 10):
        return desc.type == trt.int64
    return desc.type in (trt.float32, trt.float16, trt.bfloat16) and desc.type == in_out[0].desc.type


# plugin name -> (fields, format rule, enqueue)
SPECS: dict[str, tuple[dict, object, str]] = {
    PLUGIN_NAME: (FIELDS, _plain_formats, "_enqueue_torch"),
    CACHED_PLUGIN_NAME: (CACHED_FIELDS, _cached_formats, "_enqueue_cached"),
}

_CLASSES: dict[tuple[str, str], tuple[type, type]] = {}
_CREATORS: dict[tuple[str, str], object] = {}  # registered creators, kept alive for the registry


def _field_type(trt: ModuleType, dtype: type):
    return trt.PluginFieldType.INT32 if dtype is np.int32 else trt.PluginFieldType.FLOAT32


def plugin_classes(trt: ModuleType, name: str = PLUGIN_NAME) -> tuple[type, type]:
    """(plugin class, creator class) of plugin `name` bound to `trt` (tensorrt_rtx or tensorrt); made once."""
    if (trt.__name__, name) in _CLASSES:
        return _CLASSES[(trt.__name__, name)]
    fields, formats, enqueue_name = SPECS[name]

    class AttentionPlugin(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
        def __init__(self, **values) -> None:
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuild.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.num_outputs = 1
            self.plugin_name, self.plugin_namespace, self.plugin_version = name, PLUGIN_NAMESPACE, PLUGIN_VERSION
            for key, (dtype, default) in fields.items():
                setattr(self, key, (int if dtype is np.int32 else float)(values.get(key, default)))

        def get_capability_interface(self, kind):
            return self

        def clone(self):
            return AttentionPlugin(**{k: getattr(self, k) for k in fields})

        # build time
        def get_output_data_types(self, input_types):
            return [input_types[0]]  # out has q's dtype

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            return [inputs[0]]  # out: [B, H, S_q, D], like q

        def supports_format_combination(self, pos, in_out, num_inputs):
            if in_out[pos].desc.format != trt.TensorFormat.LINEAR:
                return False
            return formats(trt, pos, in_out, num_inputs)

        def configure_plugin(self, inputs, outputs):
            pass

        def get_fields_to_serialize(self):
            # must not raise: TensorRT silently drops the fields when it does
            return trt.PluginFieldCollection([
                trt.PluginField(key, np.array([getattr(self, key)], dtype=dtype), _field_type(trt, dtype))
                for key, (dtype, _) in fields.items()])

        # run time
        def on_shape_change(self, inputs, outputs):
            self._shapes = [tuple(t.dims) for t in inputs]

        def attach_to_context(self, context):
            return self.clone()

        def set_tactic(self, tactic):
            pass

        def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
            globals()[enqueue_name](self, input_desc, output_desc, inputs, outputs, stream)

    class AttentionCreator(trt.IPluginCreatorV3One):
        def __init__(self) -> None:
            trt.IPluginCreatorV3One.__init__(self)
            self.name, self.plugin_namespace, self.plugin_version = name, PLUGIN_NAMESPACE, PLUGIN_VERSION
            self.field_names = trt.PluginFieldCollection([
                trt.PluginField(key, np.array([]), _field_type(trt, dtype)) for key, (dtype, _) in fields.items()])

        def create_plugin(self, plugin_name, plugin_fields, phase):
            given = {f.name: f.data for f in plugin_fields}
            return AttentionPlugin(**{k: (given[k][0] if k in given and len(given[k]) else default)
                                      for k, (_, default) in fields.items()})

    AttentionPlugin.__name__, AttentionCreator.__name__ = f"{name}Plugin", f"{name}Creator"
    _CLASSES[(trt.__name__, name)] = (AttentionPlugin, AttentionCreator)
    return _CLASSES[(trt.__name__, name)]


def register(trt: ModuleType) -> bool:
    """Register both creators (the op and its cached form) with `trt`'s plugin registry, once each."""
    registry = trt.get_plugin_registry()
    ok = True
    for name in SPECS:
        if registry.get_creator(name, PLUGIN_VERSION, PLUGIN_NAMESPACE) is not None:
            continue
        _, creator_cls = plugin_classes(trt, name)
        creator = creator_cls()
        _CREATORS[(trt.__name__, name)] = creator
        ok = bool(registry.register_creator(creator, PLUGIN_NAMESPACE)) and ok
    return ok


# TensorRT DataType -> (torch dtype name, CUDA array interface typestr of a same-sized type)
_DEVICE_TYPES = {"DataType.FLOAT": ("float32", "<f4"), "DataType.HALF": ("float16", "<f2"),
                 "DataType.BF16": ("bfloat16", "<i2"), "DataType.INT64": ("int64", "<i8"),
                 "DataType.INT32": ("int32", "<i4"), "DataType.BOOL": ("bool", "|b1")}


def device_view(ptr: int, shape: tuple[int, ...], trt_type: str):
    """A torch tensor over `shape` elements at device pointer `ptr` (no copy), through the CUDA array interface."""
    import torch

    dtype_name, typestr = _DEVICE_TYPES[trt_type]
    count = int(np.prod(shape)) if shape else 1
    holder = type("DeviceBuffer", (), {"__cuda_array_interface__": {
        "shape": (count,), "typestr": typestr, "data": (int(ptr), False), "version": 3}})()
    flat = torch.as_tensor(holder, device="cuda")
    return flat.view(getattr(torch, dtype_name)).reshape(shape)


def _enqueue_torch(plugin, input_desc, output_desc, inputs, outputs, stream) -> None:
    """Run the attention on the GPU through torch (not run here: see the module docstring)."""
    import torch

    views = [device_view(ptr, tuple(d.dims), str(d.type)) for d, ptr in zip(input_desc, inputs)]
    q, k, v, window = views[:4]
    mask = views[4] if len(views) > 4 else None
    out = device_view(outputs[0], tuple(output_desc[0].dims), str(output_desc[0].type))
    with torch.cuda.stream(torch.cuda.ExternalStream(int(stream))):
        result = torch.ops.edgeattn.windowed_attention(q, k, v, window, mask, bool(plugin.causal),
                                                       int(plugin.sinks), float(plugin.scale))
        out.copy_(result)


def _enqueue_cached(plugin, input_desc, output_desc, inputs, outputs, stream) -> None:
    """The cached form on TensorRT's buffers (not run here: no RTX GPU): run_cached on device views of them."""
    import torch

    views = [device_view(ptr, tuple(d.dims), str(d.type)) for d, ptr in zip(input_desc, inputs)]
    out = device_view(outputs[0], tuple(output_desc[0].dims), str(output_desc[0].type))
    with torch.cuda.stream(torch.cuda.ExternalStream(int(stream))):
        out.copy_(run_cached(*views, sinks=plugin.sinks, scale=plugin.scale))


def run_cached(q, q_sink, k, v, past_key, past_value, cache_position, window, pages=None, key_bounds=None, *,
               sinks: int, scale: float = 0.0):
    """What the cached plugin does with its inputs (torch tensors, any device): the chunk's keys and values
    written into the cache buffers in place (the runtime binds its persistent cache there), with the pages' key
    bounds when the budget's inputs are given, and the attention over the cache as it was before the chunk:
    sinks + window rows, and the k best pages of the rest (k = `pages`, read on the device and masked past it:
    the kernels are built for every page of the ring, so no k is fixed in the engine) -> [B, H, S, D].
    One new token a stream on CUDA runs the Triton kernels (with the budget, one launch reads and writes rows
    and bounds); prefill chunks, and every step on the CPU, run the PyTorch form."""
    from edgeattn.attention.cached_torch import cached_windowed_attention, write_ring_

    budget = pages is not None
    cuda, decode = q.is_cuda, q.shape[2] == 1
    if budget:
        page = (past_key.shape[2] - sinks) // key_bounds.shape[2]
        if cuda and decode:
            from edgeattn.plugins.kernels.budget_decode import budget_decode

            return budget_decode(q[:, :, 0], q_sink[:, :, 0], k[:, :, 0], v[:, :, 0], past_key, past_value, key_bounds,
                                 cache_position, window.reshape(()), pages.reshape(()), sinks=sinks, page=page,
                                 k_max=key_bounds.shape[2], scale=scale, write=True)[:, :, None]
        from edgeattn.plugins.kernels.ring_ops import refresh_bounds_reference

        out = cached_windowed_attention(q, q_sink, k, v, past_key, past_value, cache_position, window, pages,
                                        key_bounds, sinks=sinks, scale=scale)
        write_ring_(past_key, past_value, k, v, cache_position, sinks)
        refresh_bounds_reference(past_key, key_bounds, cache_position, k.shape[2], sinks=sinks, page=page)
        return out
    if cuda and decode:
        from edgeattn.plugins.kernels.cached_decode import cached_decode

        write_ring_(past_key, past_value, k, v, cache_position, sinks)
        return cached_decode(q, q_sink, past_key, past_value, cache_position, window, sinks=sinks, scale=scale)
    out = cached_windowed_attention(q, q_sink, k, v, past_key, past_value, cache_position, window, sinks=sinks,
                                    scale=scale)
    write_ring_(past_key, past_value, k, v, cache_position, sinks)
    return out
