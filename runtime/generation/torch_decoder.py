"""The same generation API on CUDA: a Hugging Face Llama-family model, its cache on the GPU, decode steps through
the Triton kernels (plugins/kernels/cached_decode.py) and replayed as CUDA graphs.

`TorchDecoderModel` is a `DecoderBackend` (backend.py), as DecoderModel is, so the decode engine drives it
unchanged: `Generator(TorchDecoderModel(...))` generates exactly as it does from a bundle. Prefill chunks run eagerly
(edgeattn.attention.cached_torch); a decode step (one token per stream) is captured once per (streams, split
count) and replayed: the live window is a device scalar the kernel reads, so changing it needs no new capture
unless the split count (sized from the window on the host) changes.
"""

from __future__ import annotations

import weakref

import numpy as np

from edgeattn.attention.ring import RingLayout
from edgeattn.errors import InputError
from edgeattn.runtime.generation.cache import StreamPositions
from edgeattn.optional import require


class TorchKVCache(StreamPositions):
    """KVCache's interface with torch buffers: per layer [B, H_kv, C, D] on the model's device."""

    def __init__(self, *, layers: int, kv_heads: int, head_dim: int, layout: RingLayout, streams: int, dtype,
                 device) -> None:
        torch = require("torch")
        self.layout = layout
        shape = (streams, kv_heads, layout.capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.positions = np.zeros(streams, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


class TorchDecoderModel:
    def __init__(self, hf_model, tokenizer=None, *, sinks: int = 4, window_max: int = 2048, cuda_graphs: bool = True,
                 eos_token_ids: tuple[int, ...] | None = None) -> None:
        self.torch = require("torch", "generation on CUDA")
        from edgeattn.decoder.cached_llama import CachedDecoder

        self.decoder = CachedDecoder(hf_model, sinks).eval()
        self.layout = RingLayout(sinks, window_max)
        self.device = next(hf_model.parameters()).device
        self.dtype = next(hf_model.parameters()).dtype
        self.layers = len(self.decoder.layers)
        self.vocab_size = int(hf_model.config.vocab_size)
        eos = eos_token_ids if eos_token_ids is not None else hf_model.config.eos_token_id
        self.eos = set([eos] if isinstance(eos, int) else (eos or []))
        self.codec = None
        if tokenizer is not None:
            from edgeattn.runtime.generation.text import TextCodec

            self.codec = TextCodec(tokenizer.backend_tokenizer.to_str(), getattr(tokenizer, "chat_template", None),
                                   {k: getattr(tokenizer, k) for k in ("bos_token", "eos_token") if getattr(tokenizer, k, None)})
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        # decode graphs per cache, keyed by the cache object, never by its id: a new cache may take a freed one's
        # id, and a graph replayed over freed buffers reads and writes memory that is no longer that cache's
        self._graphs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def activate(self) -> "TorchDecoderModel":
        return self

    def deactivate(self) -> None:
        self._graphs.clear()

    def new_cache(self, streams: int = 1) -> TorchKVCache:
        return TorchKVCache(layers=self.layers, kv_heads=self.decoder.kv_heads, head_dim=self.decoder.head_dim,
                            layout=self.layout, streams=streams, dtype=self.dtype, device=self.device)

    def check_window(self, window: int) -> int:
        return self.layout.check_window(window)

    def step(self, cache: TorchKVCache, streams: list[int], ids, window: int, *, last_only: bool = False) -> np.ndarray:
        """ids: [len(streams), S] -> logits [len(streams), S, V] (float32, host; [.., 1, V] with `last_only`);
        the streams advance by S."""
        torch = self.torch
        ids = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=self.device)
        if ids.dim() != 2 or ids.shape[0] != len(streams):
            raise InputError(f"ids: expected [{len(streams)}, S], found {list(ids.shape)}")
        window = self.check_window(window)
        rows = list(streams)
        if ids.shape[1] == 1 and rows == list(range(len(rows))):
            logits = self._decode(cache, ids, window)
        else:
            logits = self._prefill(cache, rows, ids, window)
        cache.positions[rows] += ids.shape[1]
        return (logits[:, -1:] if last_only else logits).float().cpu().numpy()

    def _prefill(self, cache, rows, ids, window):
        from edgeattn.attention.cached_torch import write_ring_

        torch = self.torch
        index = torch.as_tensor(rows, device=self.device)
        pos = torch.as_tensor(cache.positions[rows], device=self.device)
        past = []
        for k, v in zip(cache.keys, cache.values):
            past += [k.index_select(0, index), v.index_select(0, index)]
        with torch.no_grad():
            out = self.decoder(ids, pos, torch.tensor(window, device=self.device), *past)
            for i in range(self.layers):
                write_ring_(past[2 * i], past[2 * i + 1], out[1 + 2 * i], out[2 + 2 * i], pos, self.layout.sinks)
                cache.keys[i].index_copy_(0, index, past[2 * i])
                cache.values[i].index_copy_(0, index, past[2 * i + 1])
        return out[0]

    # -- decode: one token per stream, the first B streams of the cache, through the Triton kernel --------
    def _decode_forward(self, cache, ids, pos, window_t, window_keys: int):
        from edgeattn.attention.cached_torch import write_ring_
        from edgeattn.decoder.cached_llama import apply_rope
        from edgeattn.plugins.kernels.cached_decode import cached_decode

        torch, dec = self.torch, self.decoder
        m = dec.inner.model
        b = ids.shape[0]
        positions = pos.reshape(b, 1)
        wmax = self.layout.window_max
        w = torch.where((window_t <= 0) | (window_t > wmax), torch.full_like(window_t, wmax), window_t)
        h = m.embed_tokens(ids)
        cos, sin = m.rotary_emb(h, positions)
        cos_s, sin_s = m.rotary_emb(h, torch.minimum(positions, self.layout.sinks + w))
        for i, layer in enumerate(dec.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(b, 1, dec.heads, dec.head_dim).transpose(1, 2)  # q: [B, H, 1, D]
            k = attn.k_proj(x).view(b, 1, dec.kv_heads, dec.head_dim).transpose(1, 2)  # k: [B, H_kv, 1, D]
            v = attn.v_proj(x).view(b, 1, dec.kv_heads, dec.head_dim).transpose(1, 2)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm(q), attn.k_norm(k)
            kc, vc = cache.keys[i][:b], cache.values[i][:b]
            write_ring_(kc, vc, apply_rope(k, cos, sin), v, pos, self.layout.sinks)
            o = cached_decode(apply_rope(q, cos, sin), apply_rope(q, cos_s, sin_s), kc, vc, pos, window_t,
                              sinks=self.layout.sinks, scale=dec.scale, window_keys=window_keys)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(b, 1, dec.heads * dec.head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return dec.inner.lm_head(m.norm(h))

    def _decode(self, cache, ids, window: int):
        torch = self.torch
        b = ids.shape[0]
        live = self.layout.live_window(window)
        window_keys = min(live, max(int(cache.positions[:b].max()) + 1 - self.layout.sinks, 1))
        window_keys = 1 << (window_keys - 1).bit_length()  # buckets: few captures as the stream grows
        pos = torch.as_tensor(cache.positions[:b], device=self.device)
        window_t = torch.tensor(window, dtype=torch.int64, device=self.device)
        with torch.no_grad():
            if not self.cuda_graphs:
                return self._decode_forward(cache, ids, pos, window_t, window_keys)
            graphs = self._graphs.setdefault(cache, {})
            key = (b, window_keys)
            if key not in graphs:  # first time: run the step for real (Triton compiles), then capture it
                static = {"ids": ids.clone(), "pos": pos.clone(), "window": window_t.clone()}
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    out = self._decode_forward(cache, static["ids"], static["pos"], static["window"], window_keys)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):  # records only: nothing runs, the cache is not written again
                    static["out"] = self._decode_forward(cache, static["ids"], static["pos"], static["window"],
                                                         window_keys)
                graphs[key] = (graph, static)
                return out
            graph, static = graphs[key]
            static["ids"].copy_(ids)
            static["pos"].copy_(pos)
            static["window"].copy_(window_t)
            graph.replay()
            return static["out"]
