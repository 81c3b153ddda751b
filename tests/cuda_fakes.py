"""Stand-ins for a GPU when testing cuda bundles on a CPU: a cuda bundle opened on CPU tensors with a memory
figure, and torch.cuda's answers for a GPU of a given age and size."""

from __future__ import annotations

GIB = 1 << 30
MEMORY = {"free": 80 * GIB, "total": 80 * GIB}  # what the fake GPU reports (once the weights load); tests change it


def fake_mem_get_info(device=None) -> tuple[int, int]:
    return MEMORY["free"], MEMORY["total"]


def open_on_cpu(bundle, *, window_max=None, **kw):
    """The cuda opener on CPU tensors, its memory checks fed by MEMORY (set DECODER_OPENERS["cuda"] to this): the
    first reading, before the weights load, has their bytes free besides MEMORY["free"]."""
    from edgeattn.runtime.cuda.bundle import open_cuda_decoder

    weights, reads = int(bundle.manifest.sections["decoder"]["weights_bytes"]), []

    def mem_get_info():
        free, total = fake_mem_get_info()
        reads.append(free)
        return (free + weights if len(reads) == 1 else free), total

    return open_cuda_decoder(bundle, device="cpu", window_max=window_max, mem_get_info=mem_get_info, **kw)


def pretend_gpu(monkeypatch, *, sm: int = 90, name: str = "NVIDIA H200", free: int = 80 * GIB,
                total: int = 80 * GIB, bf16: bool = True) -> None:
    """torch.cuda says a GPU of compute capability `sm` is there, with `free` of `total` bytes free."""
    import torch

    monkeypatch.setitem(MEMORY, "free", free)
    monkeypatch.setitem(MEMORY, "total", total)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: divmod(sm, 10))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "mem_get_info", fake_mem_get_info)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
