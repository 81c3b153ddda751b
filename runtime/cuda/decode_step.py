"""One decode step of a Llama-family decoder on a GPU, written for static shapes so it is captured whole in one
CUDA graph: token ids and positions in, the next token ids out (greedy on the device), the cache written in place.

    weights = PackedDecoder.from_hf(model, sinks=4, window_max=2048)
    step = DecodeGraph(weights, keys, values, batch=8, splits=1, compiled=True)
    next_ids = step(ids, positions, window)      # [B] int64 on the device; nothing else crosses to the host

Per layer the step runs RMSNorm, one matrix product for Q, K and V (packed), the rotation at t (and at
min(t, sinks + W) for the sink rows, edgeattn.attention.ring), `torch.ops.edgeattn.ring_decode` (writes the
new row, then the split-K Triton kernel reads the sinks and the last W ring rows), the output projection, and
the MLP with gate and up packed in one product. With `compiled=True` the pointwise work around the products is
fused by torch.compile (the ring op is opaque to it and keeps its cache writes in place). `compile="fused"` runs
the same step in hand-written Triton kernels instead (edgeattn.plugins.kernels.fused_decode, about 5 launches a
layer), faster up to a few streams; `compile="auto"` takes it there and "linked" above. The live window is a
device scalar: changing it needs no new capture while the split count stays.
"""

from __future__ import annotations

import os

from dataclasses import dataclass

from edgeattn.errors import ModelError
from edgeattn.optional import require
from edgeattn.runtime.cuda import fp8_cache
from edgeattn.runtime.cuda.fp8 import linear

torch = require("torch", "generation on CUDA")  # this module is the GPU path: importing it means torch is wanted

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class DecoderShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    sinks: int
    window_max: int
    scale: float

    @property
    def capacity(self) -> int:
        return self.sinks + self.window_max


class PackedDecoder:
    """The weights laid out for the step: Q, K and V rows in one matrix, gate and up rows in one."""

    def __init__(self, shape: DecoderShape, tensors: dict, inv_freq, rope_scaling: float) -> None:
        self.shape, self.t, self.inv_freq, self.rope_scaling = shape, tensors, inv_freq, rope_scaling

    @classmethod
    def from_hf(cls, model, *, sinks: int, window_max: int) -> "PackedDecoder":
        config = model.config
        if config.model_type not in SUPPORTED:
            raise ModelError(f"cuda decode step: expected a model of {', '.join(SUPPORTED)}, "
                             f"found model_type {config.model_type!r}")
        m = model.model
        first = m.layers[0].self_attn
        shape = DecoderShape(layers=len(m.layers), hidden=config.hidden_size, heads=config.num_attention_heads,
                             kv_heads=config.num_key_value_heads, head_dim=first.head_dim,
                             intermediate=config.intermediate_size, vocab=config.vocab_size,
                             eps=float(config.rms_norm_eps), sinks=int(sinks), window_max=int(window_max),
                             scale=float(first.scaling))
        with torch.no_grad():
            t = {"embed": m.embed_tokens.weight, "norm": m.norm.weight, "lm_head": model.lm_head.weight,
                 "ln1": [], "ln2": [], "wqkv": [], "bqkv": [], "wo": [], "wgu": [], "wd": [], "qn": [], "kn": []}
            for layer in m.layers:
                a, mlp = layer.self_attn, layer.mlp
                t["ln1"].append(layer.input_layernorm.weight)
                t["ln2"].append(layer.post_attention_layernorm.weight)
                t["wqkv"].append(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous())
                biases = [p.bias for p in (a.q_proj, a.k_proj, a.v_proj)]
                t["bqkv"].append(torch.cat(biases).contiguous() if biases[0] is not None else None)
                t["wo"].append(a.o_proj.weight)
                t["wgu"].append(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).contiguous())
                t["wd"].append(mlp.down_proj.weight)
                t["qn"].append(a.q_norm.weight if hasattr(a, "q_norm") else None)
                t["kn"].append(a.k_norm.weight if hasattr(a, "k_norm") else None)
        rotary = m.rotary_emb
        return cls(shape, t, rotary.inv_freq.float(), float(getattr(rotary, "attention_scaling", 1.0)))

    PER_LAYER = ("ln1", "ln2", "wqkv", "bqkv", "wo", "wgu", "wd", "qn", "kn")

    def state_dict(self) -> dict:
        """Flat name -> tensor (what a cuda bundle's weights.safetensors holds); the LM head is left out when it
        is the embedding (tied), and so are absent biases and norms."""
        t = self.t
        out = {"embed": t["embed"], "norm": t["norm"], "inv_freq": self.inv_freq}
        if t["lm_head"].data_ptr() != t["embed"].data_ptr():
            out["lm_head"] = t["lm_head"]
        for name in self.PER_LAYER:
            for i, x in enumerate(t[name]):
                if x is not None:
                    out[f"{name}.{i}"] = x
        if t.get("kv_scale") is not None:  # an FP8 cache's scales (fp8_cache.py)
            out["kv_scale"] = t["kv_scale"]
        return {k: v.detach().contiguous() for k, v in out.items()}

    @classmethod
    def from_state_dict(cls, shape: DecoderShape, tensors: dict, rope_scaling: float) -> "PackedDecoder":
        t = {"embed": tensors["embed"], "norm": tensors["norm"], "lm_head": tensors.get("lm_head", tensors["embed"])}
        for name in cls.PER_LAYER:
            t[name] = [tensors.get(f"{name}.{i}") for i in range(shape.layers)]
        if "kv_scale" in tensors:
            t["kv_scale"] = tensors["kv_scale"].float()
        return cls(shape, t, tensors["inv_freq"].float(), rope_scaling)

    @property
    def device(self):
        return self.t["embed"].device

    @property
    def dtype(self):
        return self.t["embed"].dtype

    def new_cache(self, streams: int):
        """keys, values: per layer [streams, H_kv, sinks + W_max, D] on the weights' device, zero-filled
        (fp8_cache.Layers; an FP8 cache's also hold its float sink buffers, [streams, H_kv, sinks + 1, D])."""
        s = self.shape
        size = (streams, s.kv_heads, s.capacity, s.head_dim)
        zeros = lambda size, dtype: [torch.zeros(size, dtype=dtype, device=self.device)  # noqa: E731
                                     for _ in range(s.layers)]
        fp8 = self.t.get("kv_scale") is not None
        make = lambda: fp8_cache.Layers.of(zeros(size, self.cache_dtype), zeros(  # noqa: E731
            (streams, s.kv_heads, s.sinks + 1, s.head_dim), self.dtype) if fp8 else None)
        return make(), make()

    @property
    def cache_dtype(self):
        """float8_e4m3fn when the weights carry FP8 cache scales (fp8_cache.py), else the weights' float type."""
        return torch.float8_e4m3fn if self.t.get("kv_scale") is not None else self.dtype

    def cache_bytes_per_stream(self) -> int:
        s = self.shape
        if self.t.get("kv_scale") is None:
            return 2 * s.layers * s.kv_heads * s.capacity * s.head_dim * self.t["embed"].element_size()
        sinks = (s.sinks + 1) * self.t["embed"].element_size()  # the float sink buffers (fp8_cache.Layers)
        return 2 * s.layers * s.kv_heads * (s.capacity + sinks) * s.head_dim


def _rms_norm(torch, x, w, eps):
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate(torch, x, cos, sin):
    """x: [B, H, D]; cos, sin: [B, 1, D] in x's dtype (Hugging Face's rotate_half convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _angles(torch, inv_freq, positions, scaling, dtype):
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [B, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, D]
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def layer_head(h, ln1, wqkv, bqkv, qn, kn, cos, sin, cos_s, sin_s, *, shape: DecoderShape):
    """Before attention: h [B, hidden] -> (q at t, q at the sinks' position, k at t, v), [B, H(_kv), D] each."""
    s, b = shape, h.shape[0]
    nq, nk = s.heads * s.head_dim, s.kv_heads * s.head_dim
    qkv = linear(_rms_norm(torch, h, ln1, s.eps), wqkv, bqkv)  # fp8.linear: FP8 weights are tuples
    q = qkv[:, :nq].view(b, s.heads, s.head_dim)  # q: [B, H, D]
    k = qkv[:, nq:nq + nk].view(b, s.kv_heads, s.head_dim)  # k, v: [B, H_kv, D]
    v = qkv[:, nq + nk:].view(b, s.kv_heads, s.head_dim)
    if qn is not None:  # Qwen3: per-head norms before the rotation
        q, k = _rms_norm(torch, q, qn, s.eps), _rms_norm(torch, k, kn, s.eps)
    return _rotate(torch, q, cos, sin), _rotate(torch, q, cos_s, sin_s), _rotate(torch, k, cos, sin), v.contiguous()


def layer_tail(h, o, wo, ln2, wgu, wd, *, shape: DecoderShape):
    """After attention: the output projection and the MLP with their residuals -> h [B, hidden]."""
    F = torch.nn.functional
    h = h + linear(o.reshape(h.shape[0], -1), wo)
    gate, up = linear(_rms_norm(torch, h, ln2, shape.eps), wgu).chunk(2, dim=-1)
    return h + linear(F.silu(gate) * up, wd)


def head_writing(h, ln1, wqkv, bqkv, qn, kn, cos, sin, cos_s, sin_s, k_cache, v_cache, streams, rows, *,
                 shape: DecoderShape, k_scale=None, v_scale=None, k_sinks=None, v_sinks=None):
    """layer_head that also writes the new key and value rows into the layer's cache (in place) -> (q, q_sink)."""
    q, q_s, k, v = layer_head(h, ln1, wqkv, bqkv, qn, kn, cos, sin, cos_s, sin_s, shape=shape)
    fp8_cache.store(k_cache, streams, rows, k, k_scale, k_sinks)  # FP8 rows when the scales are given
    fp8_cache.store(v_cache, streams, rows, v, v_scale, v_sinks)
    return q, q_s


def layer_link(h, o, wo, ln2, wgu, wd, ln1, wqkv, bqkv, qn, kn, cos, sin, cos_s, sin_s, k_cache, v_cache, streams,
               rows, *, shape: DecoderShape, k_scale=None, v_scale=None, k_sinks=None, v_sinks=None):
    """One layer's tail and the next layer's head (with its cache write) as one piece: the residual, the norm
    and the rotation between them fuse."""
    h = layer_tail(h, o, wo, ln2, wgu, wd, shape=shape)
    return (h, *head_writing(h, ln1, wqkv, bqkv, qn, kn, cos, sin, cos_s, sin_s, k_cache, v_cache, streams, rows,
                             shape=shape, k_scale=k_scale, v_scale=v_scale, k_sinks=k_sinks, v_sinks=v_sinks))


def decode_linked(w: PackedDecoder, ids, positions, window, keys, values, splits: int = 0, *,
                  first=head_writing, link=layer_link, tail=layer_tail):
    """decode_logits with the cache writes inside the pieces (first head, links, last tail) and attention by
    `torch.ops.edgeattn.ring_attend` (it reads the rows already written)."""
    import edgeattn.plugins.kernels.ring_ops  # noqa: F401  (registers the ops)

    F, s, t = torch.nn.functional, w.shape, w.t
    wl = torch.where((window <= 0) | (window > s.window_max), s.window_max, window)
    cos, sin = _angles(torch, w.inv_freq, positions, w.rope_scaling, w.dtype)
    cos_s, sin_s = _angles(torch, w.inv_freq, torch.minimum(positions, s.sinks + wl), w.rope_scaling, w.dtype)
    streams = torch.arange(ids.shape[0], device=ids.device)
    p = positions.to(torch.int64)
    rows = torch.where(p < s.sinks, p, s.sinks + torch.remainder(p - s.sinks, s.window_max))
    h = F.embedding(ids, t["embed"])  # h: [B, hidden]
    q, q_s = first(h, t["ln1"][0], t["wqkv"][0], t["bqkv"][0], t["qn"][0], t["kn"][0], cos, sin, cos_s, sin_s,
                   keys[0], values[0], streams, rows, shape=s, **_fp8_args(w, keys, values, 0))
    for i in range(s.layers):
        o = fp8_cache.attend(q, q_s, keys[i], values[i], *fp8_cache.layer_scales(w, i), positions, window, s.sinks,
                             s.scale, splits, *fp8_cache.sink_buffers(keys, values, i))  # ring_attend, or FP8
        if i + 1 == s.layers:
            h = tail(h, o, t["wo"][i], t["ln2"][i], t["wgu"][i], t["wd"][i], shape=s)
            break
        j = i + 1
        h, q, q_s = link(h, o, t["wo"][i], t["ln2"][i], t["wgu"][i], t["wd"][i], t["ln1"][j], t["wqkv"][j],
                         t["bqkv"][j], t["qn"][j], t["kn"][j], cos, sin, cos_s, sin_s, keys[j], values[j], streams,
                         rows, shape=s, **_fp8_args(w, keys, values, j))
    return F.linear(_rms_norm(torch, h, t["norm"], s.eps), t["lm_head"])


def _fp8_args(w: PackedDecoder, keys, values, i: int) -> dict:
    """head_writing's FP8 cache scales and sink buffers for layer i (none for a float cache: the defaults)."""
    k_scale, v_scale = fp8_cache.layer_scales(w, i)
    if k_scale is None:
        return {}
    k_sinks, v_sinks = fp8_cache.sink_buffers(keys, values, i)
    return {"k_scale": k_scale, "v_scale": v_scale, "k_sinks": k_sinks, "v_sinks": v_sinks}


def decode_logits(w: PackedDecoder, ids, positions, window, keys, values, splits: int = 0, *,
                  head=layer_head, tail=layer_tail):
    """ids, positions: [B] int64 (positions: tokens each stream holds before this one); window: [] int64.
    Writes each stream's new row into `keys`/`values` (per layer [B', H_kv, C, D]) and returns logits [B, V].
    `head` / `tail`: the per-layer pieces around attention (compiled versions of layer_head / layer_tail)."""
    import edgeattn.plugins.kernels.ring_ops  # noqa: F401  (registers torch.ops.edgeattn.ring_decode)

    F, s, t = torch.nn.functional, w.shape, w.t
    wl = torch.where((window <= 0) | (window > s.window_max), s.window_max, window)
    cos, sin = _angles(torch, w.inv_freq, positions, w.rope_scaling, w.dtype)
    cos_s, sin_s = _angles(torch, w.inv_freq, torch.minimum(positions, s.sinks + wl), w.rope_scaling, w.dtype)
    h = F.embedding(ids, t["embed"])  # h: [B, hidden]
    for i in range(s.layers):
        q, q_s, k, v = head(h, t["ln1"][i], t["wqkv"][i], t["bqkv"][i], t["qn"][i], t["kn"][i], cos, sin, cos_s,
                            sin_s, shape=s)
        if "kv_scale" in t:  # an FP8 cache: write the rows quantized, then the FP8 ring attention
            ks, vs = fp8_cache.layer_scales(w, i)
            streams, p = torch.arange(ids.shape[0], device=ids.device), positions.to(torch.int64)
            rows = torch.where(p < s.sinks, p, s.sinks + torch.remainder(p - s.sinks, s.window_max))
            k_sinks, v_sinks = fp8_cache.sink_buffers(keys, values, i)
            fp8_cache.store(keys[i], streams, rows, k, ks, k_sinks)
            fp8_cache.store(values[i], streams, rows, v, vs, v_sinks)
            o = fp8_cache.attend(q, q_s, keys[i], values[i], ks, vs, positions, window, s.sinks, s.scale, splits,
                                 k_sinks, v_sinks)
        else:
            o = torch.ops.edgeattn.ring_decode(q, q_s, k, v, keys[i], values[i], positions, window, s.sinks, s.scale,
                                               splits)
        h = tail(h, o, t["wo"][i], t["ln2"][i], t["wgu"][i], t["wd"][i], shape=s)
    return F.linear(_rms_norm(torch, h, t["norm"], s.eps), t["lm_head"])


def decode_fused(w: PackedDecoder, ids, positions, window, keys, values, splits: int = 0, *, greedy: bool = False):
    """decode_logits in hand-written Triton kernels (edgeattn.plugins.kernels.fused_decode), about 5 launches a
    layer: norm + Q/K/V + rotation + cache write, attention, output projection + residual, norm + gate/up + SiLU,
    down projection + residual; then norm + LM head (+ the argmax on the device with `greedy`: [B] int64)."""
    if "kv_scale" in w.t or isinstance(w.t["wqkv"][0], tuple):  # FP8 weights or cache: the kernels read bf16
        logits = decode_logits(w, ids, positions, window, keys, values, splits)
        return logits.argmax(dim=-1) if greedy else logits
    from edgeattn.plugins.kernels import fused_decode as fk  # loads triton
    from edgeattn.plugins.kernels.cached_decode import cached_decode

    s, t, b = w.shape, w.t, ids.shape[0]
    ids, positions = ids.contiguous(), positions.contiguous()  # the kernels index them as [B]
    tiles = fk.fused_tiles(b, ids.device)  # with programmatic dependent launch on Hopper and newer
    if not tiles.gemv and s.head_dim < 32:  # tl.dot tiles hold half a head, and want >= 16 rows
        raise ModelError(f"fused decode step: expected a head_dim >= 32 for a batch above {fk.GEMV_MAX_BATCH}, "
                         f"found {s.head_dim}")
    new = lambda *size: torch.empty(size, dtype=w.dtype, device=ids.device)  # noqa: E731
    h, act = new(b, s.hidden), new(b, s.intermediate)  # h: the residual stream [B, hidden]
    q, q_s = new(b, s.heads, s.head_dim), new(b, s.heads, s.head_dim)  # q, q_s: [B, H, D]
    inv_freq = w.inv_freq.to(device=ids.device, dtype=torch.float32).contiguous()
    # split attention: the last split program of a kv head merges the partials (one counter for every layer)
    counter = torch.zeros(b * s.kv_heads, dtype=torch.int32, device=ids.device) \
        if os.environ.get("EDGEATTN_SPLIT_MERGE", "last") == "last" else None
    for i in range(s.layers):
        fk.qkv_rope(t["embed"] if i == 0 else h, ids, h, t["ln1"][i], t["wqkv"][i], t["bqkv"][i], t["qn"][i],
                    t["kn"][i], inv_freq, positions, window, q, q_s, keys[i], values[i], heads=s.heads,
                    kv_heads=s.kv_heads, sinks=s.sinks, eps=s.eps, rope_scale=w.rope_scaling, tiles=tiles,
                    from_ids=i == 0)
        o = cached_decode(q[:, :, None], q_s[:, :, None], keys[i][:b], values[i][:b], positions, window,
                          sinks=s.sinks, scale=s.scale, splits=splits or None, pdl=tiles.pdl,
                          counter=counter)  # o: [B, H, 1, D]
        fk.linear_residual(o.view(b, -1), t["wo"][i], h, tiles=tiles)
        fk.gate_up(h, t["ln2"][i], t["wgu"][i], act, eps=s.eps, tiles=tiles)
        fk.linear_residual(act, t["wd"][i], h, tiles=tiles)
    return fk.lm_head(h, t["norm"], t["lm_head"], eps=s.eps, tiles=tiles, greedy=greedy)


def decode_greedy(w: PackedDecoder, ids, positions, window, keys, values, splits: int = 0, *,
                  _logits=None, **pieces):
    """decode_logits, then the argmax on the device: [B] int64."""
    return (_logits or decode_logits)(w, ids, positions, window, keys, values, splits, **pieces).argmax(dim=-1)


COMPILE_MODES = ("none", "layers", "linked", "whole", "fused", "auto")
# "auto": the fused step up to this batch, "linked" above. On the H200 (SmolLM2-135M's shape, context 8,192) fused
# was faster at batch 1 (0.66-0.80 ms against 1.14-1.23), level at batch 64 with W=1,024 (1.64 ms both) and faster
# at W=256 (1.14 against 1.28), 15% slower with the whole 8,192 ring (5.33 against 4.66): one graph serves every
# window, and the windows the thermal controller sets are where fused wins. Larger batches were not measured fused.
FUSED_MAX_BATCH = 64
GEMV_MAX_BATCH = 4  # fused_decode.GEMV_MAX_BATCH (without importing triton): tl.dot tiles above, head_dim >= 32


class DecodeGraph:
    """A decode step for the first `batch` streams of a cache, captured once in a CUDA graph and replayed.

    `compile`: "none", "layers" (torch.compile on the pieces around attention: one compilation serves every
    layer, window and split count), "linked" (a layer's tail and the next one's head, cache writes included,
    compiled as one piece), "whole" (the step as one graph, recompiled per split count) or "fused" (no
    torch.compile: hand-written Triton kernels, 5 launches a layer, decode_fused); "auto": "fused" for a
    batch up to FUSED_MAX_BATCH (and a head_dim >= 32 above GEMV_MAX_BATCH), "linked" above (what measured faster
    on the H200). `splits`:
    programs per kv head of the attention kernel (fixed by the capture; cached_decode_splits sizes it)."""

    def __init__(self, weights: PackedDecoder, keys, values, *, batch: int, splits: int = 0,
                 compile: str = "none", greedy: bool = True, sampling=None) -> None:
        self.torch = torch
        self.weights, self.keys, self.values, self.batch, self.splits = weights, keys, values, batch, splits
        dev = weights.device
        self.ids = torch.zeros(batch, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(batch, dtype=torch.int64, device=dev)
        self.window = torch.zeros((), dtype=torch.int64, device=dev)
        if compile not in COMPILE_MODES:
            raise ValueError(f"compile: expected one of {COMPILE_MODES}, found {compile!r}")
        if compile == "auto":  # the fused kernels read bf16: FP8 weights or an FP8 cache take the linked pieces
            fp8 = "kv_scale" in weights.t or isinstance(weights.t["wqkv"][0], tuple)
            small_heads = batch > GEMV_MAX_BATCH and weights.shape.head_dim < 32  # tl.dot tiles want >= 32
            compile = "fused" if batch <= FUSED_MAX_BATCH and not fp8 and not small_heads else "linked"
        self.compile = compile
        fn = decode_greedy if greedy else decode_logits
        self.sampling = sampling  # DeviceSampling for `batch` rows: the graph samples (greedy rows included)
        if sampling is not None:
            fn = _sampled(sampling)
        self._pieces = {}
        if compile == "whole":
            fn = torch.compile(fn, fullgraph=True, dynamic=False)
        elif compile == "layers":
            self._pieces = {"head": _compiled(torch, layer_head), "tail": _compiled(torch, layer_tail)}
        elif compile == "linked":
            self._pieces = {"first": _compiled(torch, head_writing), "link": _compiled(torch, layer_link),
                            "tail": _compiled(torch, layer_tail)}
            fn = _linked(fn)
        elif compile == "fused":
            fn = _fused(fn)
        self._fn = fn
        self.graph = None
        self.out = None

    def _run(self):
        return self._fn(self.weights, self.ids, self.positions, self.window, self.keys, self.values, self.splits,
                        **self._pieces)

    def capture(self) -> None:
        """Warm up on a side stream (compiles; writes the rows of the current inputs), then record."""
        torch = self.torch
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(stream):
            for _ in range(2):
                self._run()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.out = self._run()


    def __call__(self, ids, positions, window):
        """ids, positions: [batch] int64 tensors (any device); window: int or [] tensor -> token ids [batch] (or
        logits [batch, V]) on the device. Off CUDA (tests) the step runs eagerly, with no graph."""
        self.ids.copy_(ids, non_blocking=True)
        self.positions.copy_(positions, non_blocking=True)
        if isinstance(window, int):
            self.window.fill_(window)
        else:
            self.window.copy_(window, non_blocking=True)
        if self.ids.device.type != "cuda":
            with self.torch.no_grad():
                return self._run()
        if self.graph is None:
            self.capture()
        self.graph.replay()
        return self.out


def _linked(fn):
    """The same step through decode_linked (fn is decode_greedy, decode_logits or a sampled step)."""
    if fn is decode_logits:
        return decode_linked

    def step(w, ids, positions, window, keys, values, splits=0, **pieces):
        return fn(w, ids, positions, window, keys, values, splits, _logits=decode_linked, **pieces)

    return step


def _fused(fn):
    """The same step through decode_fused (fn is decode_greedy, decode_logits or a sampled step)."""
    if fn is decode_greedy:
        return lambda w, ids, positions, window, keys, values, splits=0: decode_fused(
            w, ids, positions, window, keys, values, splits, greedy=True)
    if fn is decode_logits:
        return decode_fused

    def step(w, ids, positions, window, keys, values, splits=0):
        return fn(w, ids, positions, window, keys, values, splits, _logits=decode_fused)

    return step


def _sampled(params):
    from edgeattn.runtime.cuda.sampling import sample

    def step(w, ids, positions, window, keys, values, splits=0, *, _logits=None, **pieces):
        logits = (_logits or decode_logits)(w, ids, positions, window, keys, values, splits, **pieces)
        return sample(logits, params, positions + 1)  # the token drawn here takes position t + 1

    return step


_COMPILED: dict = {}
RECOMPILE_LIMIT = 32


def _compiled(torch, fn):
    """One torch.compile wrapper per piece for the process (its compilations are shared by every graph)."""
    if fn not in _COMPILED:
        # one piece serves every layer, cache type (float or FP8, with its sink buffers) and weight type: more
        # variants than dynamo's default of 8 recompilations in one process that runs several
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
        _COMPILED[fn] = torch.compile(fn, fullgraph=True)  # a second batch size makes the batch dim dynamic
    return _COMPILED[fn]
