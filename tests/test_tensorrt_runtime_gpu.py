"""The TensorRT backend's CUDA side on a real GPU, with the engine replaced by a stand-in.

No machine here has both TensorRT and a GPU it accepts (the lent H200 has no TensorRT and TensorRT for
RTX refuses sm_90), so the engine and its context are stand-ins whose `execute_async_v3` runs y = 2x with
torch on the given stream. What runs for real: the cuda-python buffers, copies, profile choice, CUDA
graph capture and replay, and the plugin's device views. Skips without a CUDA GPU and torch.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgeattn.runtime.backends.tensorrt import TensorRTBackend, cuda_device
from onnx_fixtures import has

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda_device() is None or not has("torch"),
                                                  reason="needs an NVIDIA GPU, cuda-python and torch")]


class _Mode:
    INPUT, OUTPUT = "input", "output"


class _Trt:  # the two things the backend takes from the TensorRT module
    TensorIOMode = _Mode

    @staticmethod
    def nptype(dtype):
        return np.float32


class _Engine:
    num_io_tensors, num_optimization_profiles = 2, 2
    profiles = [((1, 4), (2, 4), (4, 4)), ((4, 4), (8, 4), (16, 4))]

    def get_tensor_name(self, i):
        return ["x", "y"][i]

    def get_tensor_mode(self, name):
        return _Mode.INPUT if name == "x" else _Mode.OUTPUT

    def get_tensor_shape(self, name):
        return (-1, 4)

    def get_tensor_profile_shape(self, name, profile):
        return self.profiles[profile]

    def get_tensor_dtype(self, name):
        return "float32"


class _Context:
    def __init__(self):
        self.addresses, self.shape, self.runs, self.profiles = {}, None, 0, []

    def set_optimization_profile_async(self, profile, stream):
        self.profiles.append(profile)

    def set_input_shape(self, name, shape):
        self.shape = tuple(shape)

    def get_tensor_shape(self, name):
        return self.shape

    def set_tensor_address(self, name, ptr):
        self.addresses[name] = int(ptr)

    def is_stream_capturable(self, stream):
        return True

    def execute_async_v3(self, stream):
        import torch

        from edgeattn.plugins.tensorrt.rtx import device_view

        self.runs += 1
        x = device_view(self.addresses["x"], self.shape, "DataType.FLOAT")
        y = device_view(self.addresses["y"], self.shape, "DataType.FLOAT")
        with torch.cuda.stream(torch.cuda.ExternalStream(int(stream))):
            torch.mul(x, 2.0, out=y)
        return True


def test_buffers_profiles_and_cuda_graph_replay(tmp_path):
    backend = TensorRTBackend(tmp_path / "stand-in.engine")
    context = _Context()
    backend._attach(_Trt, _Engine(), context)
    rng = np.random.default_rng(0)
    try:
        x = rng.standard_normal((2, 4)).astype(np.float32)
        np.testing.assert_array_equal(backend.infer({"x": x})["y"], 2 * x)
        assert len(backend._graphs) == 1 and backend.graph_notes == {}  # captured after the first run
        runs = context.runs
        x2 = rng.standard_normal((2, 4)).astype(np.float32)
        np.testing.assert_array_equal(backend.infer({"x": x2})["y"], 2 * x2)  # the graph reads the new input
        assert context.runs == runs  # replayed, not executed again
        big = rng.standard_normal((12, 4)).astype(np.float32)  # profile 1, larger buffers
        np.testing.assert_array_equal(backend.infer({"x": big})["y"], 2 * big)
        assert context.profiles == [0, 1]
        with pytest.raises(Exception, match="fit none"):
            backend.infer({"x": np.zeros((32, 4), np.float32)})
    finally:
        backend.deactivate()


@pytest.mark.parametrize("dtype,trt_type", [("float32", "DataType.FLOAT"), ("float16", "DataType.HALF"),
                                            ("bfloat16", "DataType.BF16"), ("int64", "DataType.INT64"),
                                            ("bool", "DataType.BOOL")])
def test_plugin_device_views_alias_the_buffer(dtype, trt_type):
    import torch

    from edgeattn.plugins.tensorrt.rtx import device_view

    t = (torch.arange(24, device="cuda") % 3).to(getattr(torch, dtype)).reshape(2, 3, 4)
    view = device_view(t.data_ptr(), (2, 3, 4), trt_type)
    assert view.dtype == t.dtype and view.shape == t.shape and torch.equal(view, t)
    view.zero_()
    assert not t.any()  # the same memory, no copy


def test_activate_refuses_a_gpu_the_engine_was_not_built_for(tmp_path):
    major, minor = cuda_device()
    sm = major * 10 + minor
    built_for = tuple(s for s in (75, 80, 86, 89, 120, 121) if s != sm)  # the rtx target's SMs, less this one
    backend = TensorRTBackend(tmp_path / "model.engine", compute_capabilities=built_for)
    with pytest.raises(Exception, match=f"found a GPU with SM{sm}"):
        backend.activate()
