"""ONNX files as tools other than edgeattn write them: ONNX Runtime's transformers optimizer on a MiniLM
export, and small com.microsoft attention graphs written as code (the forms the optimizer emits for
decoders: unidirectional Attention, with a KV cache, with an attention bias, GroupQueryAttention)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MINILM_HEADS, MINILM_HIDDEN = 12, 384
MS = "com.microsoft"


def ort_optimized(src: Path, out: Path, *, model_type: str = "bert", num_heads: int = MINILM_HEADS,
                  hidden_size: int = MINILM_HIDDEN, mha: bool = False, raw_mask: bool = False) -> Path:
    """`optimize_model(src, model_type=...)` as a CPU user runs it (fusions on), saved to `out`.
    mha: MultiHeadAttention instead of Attention; raw_mask: the 2-D mask instead of a 1-D mask_index."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions(model_type)
    options.use_multi_head_attention = mha
    if raw_mask:
        options.use_raw_attention_mask(True)
    model = optimize_model(str(src), model_type=model_type, num_heads=num_heads, hidden_size=hidden_size,
                           optimization_options=options)
    model.save_model_to_file(str(out))
    return out


def op_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        key = f"{node.domain}:{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
        counts[key] = counts.get(key, 0) + 1
    return counts


def tiny_gpt2():
    """GPT-2 (Conv1D projections, fused c_attn, tanh GELU), 2 layers, random weights."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


HEADS, HEAD_DIM = 2, 8
HIDDEN = HEADS * HEAD_DIM


def contrib_attention(form: str = "plain", *, unidirectional: int = 0, opset: int = 18) -> onnx.ModelProto:
    """x [B, S, 16], attention_mask [B, S] -> one com.microsoft attention node -> y [B, S, 16].

    form: "plain" (Attention, mask_index = number of real tokens, as EmbedLayerNormalization writes it),
    "raw" (Attention with the 2-D int32 mask), "past" (Attention with a KV cache input and a present output),
    "bias" (Attention with an attention_bias input), "mha" (MultiHeadAttention, Q/K/V MatMuls outside,
    the bias inside), "gqa" (GroupQueryAttention with a local window).
    """
    rng = np.random.default_rng(0)
    w = rng.standard_normal((HIDDEN, 3 * HIDDEN)).astype(np.float32) * 0.3
    b = rng.standard_normal(3 * HIDDEN).astype(np.float32) * 0.1
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array([1], np.int64), "ax1")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", HIDDEN])]
    nodes = [helper.make_node("Cast", ["attention_mask"], ["mask32"], to=TensorProto.INT32),
             helper.make_node("ReduceSum", ["mask32", "ax1"], ["index"], keepdims=0)]
    attrs = {"num_heads": HEADS, "unidirectional": unidirectional}
    if form in ("plain", "raw"):
        nodes.append(helper.make_node("Attention", ["x", "w", "b", "index" if form == "plain" else "mask32"], ["y"],
                                      domain=MS, **attrs))
    elif form == "past":
        cache = [2, "batch", HEADS, "past_seq", HEAD_DIM]  # [2, B, N, P, D]
        inputs.append(helper.make_tensor_value_info("past", TensorProto.FLOAT, cache))
        outputs.append(helper.make_tensor_value_info("present", TensorProto.FLOAT, cache[:3] + ["total", HEAD_DIM]))
        nodes.append(helper.make_node("Attention", ["x", "w", "b", "", "past"], ["y", "present"], domain=MS, **attrs))
    elif form == "bias":
        rel = rng.standard_normal((1, HEADS, 1, 1)).astype(np.float32)
        inits.append(numpy_helper.from_array(rel, "rel"))
        nodes.append(helper.make_node("Attention", ["x", "w", "b", "index", "", "rel"], ["y"], domain=MS, **attrs))
    elif form == "mha":
        for i, n in enumerate("qkv"):
            inits.append(numpy_helper.from_array(w[:, i * HIDDEN:(i + 1) * HIDDEN].copy(), f"w{n}"))
            nodes.append(helper.make_node("MatMul", ["x", f"w{n}"], [n]))
        nodes.append(helper.make_node("MultiHeadAttention", ["q", "k", "v", "b", "index"], ["y"], domain=MS, **attrs))
    elif form == "gqa":
        inits.append(numpy_helper.from_array(np.array(0, np.int32), "zero"))
        nodes += [helper.make_node("MatMul", ["x", "w"], ["qkv"]),
                  helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=-1, num_outputs=3),
                  helper.make_node("Sub", ["index", "one32"], ["seqlens_k"]),
                  helper.make_node("Shape", ["x"], ["xs"], start=1, end=2),
                  helper.make_node("Cast", ["xs"], ["xs32"], to=TensorProto.INT32),
                  helper.make_node("Squeeze", ["xs32"], ["total"]),
                  helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens_k", "total"], ["y"],
                                   domain=MS, num_heads=HEADS, kv_num_heads=HEADS, local_window_size=4)]
        inits.append(numpy_helper.from_array(np.array(1, np.int32), "one32"))
    else:
        raise ValueError(form)
    graph = helper.make_graph(nodes, f"contrib-{form}", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                             ir_version=9)


def contrib_reference(x: np.ndarray, mask: np.ndarray, *, causal: bool, window: int = 0) -> np.ndarray:
    """What `contrib_attention("plain")` computes, in numpy, with an attention window (0 = full): a query at
    position i sees keys j with i - window < j (and j <= i when causal), among the real tokens."""
    model = contrib_attention("plain")
    params = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    qkv = x @ params["w"] + params["b"]
    q, k, v = (qkv[..., i * HIDDEN:(i + 1) * HIDDEN].reshape(*x.shape[:2], HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
               for i in range(3))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HEAD_DIM)
    s = x.shape[1]
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    allowed = np.ones((s, s), bool) if not causal else j <= i
    if window:
        allowed = allowed & (np.abs(i - j) < window)
    allowed = allowed[None, None] & mask.astype(bool)[:, None, None, :]
    scores = np.where(allowed, scores, -np.inf)
    with np.errstate(invalid="ignore"):  # padded query rows with no key in their window: NaN, never compared
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p = p / p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(*x.shape[:2], HIDDEN)


# Hugging Face Optimum's ONNX exports, written here the way Optimum writes them: its exporter is the TorchScript
# exporter behind a wrapper, with these input/output names and dim names. (optimum-onnx needs transformers < 4.58
# and does not install beside transformers 5; docs/attention-fusion.md.)
OPTIMUM_OPSET = 14  # optimum's default opset for BERT and Llama exports


def optimum_style_encoder(model, out: Path, opset: int = OPTIMUM_OPSET) -> Path:
    """input_ids, attention_mask, token_type_ids [batch_size, sequence_length] -> last_hidden_state."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    ids = torch.randint(0, 1000, (2, 16))
    names = ["input_ids", "attention_mask", "token_type_ids"]
    dyn = {n: {0: "batch_size", 1: "sequence_length"} for n in [*names, "last_hidden_state"]}
    with torch.no_grad():
        torch.onnx.export(Encoder(model).eval(), (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(out),
                          dynamo=False, opset_version=opset, input_names=names, output_names=["last_hidden_state"],
                          dynamic_axes=dyn)
    return out


PAST, TOTAL = "past_sequence_length", "past_sequence_length + sequence_length"


def cache_names(layers: int) -> tuple[list[str], list[str]]:
    return ([f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")],
            [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")])


def optimum_style_decoder_with_past(model, out: Path, opset: int = OPTIMUM_OPSET) -> Path:
    """Optimum's `text-generation-with-past` export of a Llama: input_ids, attention_mask [batch_size, past +
    new], position_ids, past_key_values.N.key/value [batch_size, H_kv, past_sequence_length, D] -> logits,
    present.N.key/value (past + new)."""
    import torch
    import transformers

    cfg = model.config
    layers, kv_heads = cfg.num_hidden_layers, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    class WithPast(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = transformers.DynamicCache(config=self.inner.config)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            result = self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                past_key_values=cache, use_cache=True)
            return (result.logits, *[t for layer in result.past_key_values.layers for t in (layer.keys, layer.values)])

    b, p, s = 2, 5, 3
    ids = torch.randint(0, 1000, (b, s))
    mask, pos = torch.ones(b, p + s, dtype=torch.int64), torch.arange(p, p + s)[None].expand(b, s)
    past = [torch.randn(b, kv_heads, p, head_dim) for _ in range(2 * layers)]
    past_names, present_names = cache_names(layers)
    dyn = {"input_ids": {0: "batch_size", 1: "sequence_length"}, "attention_mask": {0: "batch_size", 1: TOTAL},
           "position_ids": {0: "batch_size", 1: "sequence_length"}, "logits": {0: "batch_size", 1: "sequence_length"},
           **{n: {0: "batch_size", 2: PAST} for n in past_names},
           **{n: {0: "batch_size", 2: TOTAL} for n in present_names}}
    with torch.no_grad():
        torch.onnx.export(WithPast(model).eval(), (ids, mask, pos, *past), str(out), dynamo=False, opset_version=opset,
                          input_names=["input_ids", "attention_mask", "position_ids", *past_names],
                          output_names=["logits", *present_names], dynamic_axes=dyn)
    return out


def with_past_dims(past: int, seq: tuple[int, int, int]) -> tuple:
    """BuildConfig.dims for an Optimum decoder: a fixed past length, and past + new following the new tokens."""
    return ((PAST, (past, past, past)), (TOTAL, tuple(past + n for n in seq)))


def run_with_cache(path: Path, ids: np.ndarray, prompt: int) -> list[np.ndarray]:
    """A decoder with past run as Optimum's runtime runs it: ids[:, :prompt] with an empty past, then the rest with
    the present it returned. The outputs of both calls (logits, present.*), in order. A built model's window input
    gets 0 (full) and `logits_to_keep` 0 (every position)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    past = [n for n in names if n.startswith("past_key_values.")]
    shape = next(i.shape for i in sess.get_inputs() if i.name == past[0])
    cache = {n: np.zeros((ids.shape[0], shape[1], 0, shape[3]), np.float32) for n in past}
    extra = {"attention_window": np.array(0, np.int64), "logits_to_keep": np.array(0, np.int64)}
    outs = []
    for start, stop in ((0, prompt), (prompt, ids.shape[1])):
        positions = np.broadcast_to(np.arange(start, stop), (ids.shape[0], stop - start))
        feeds = {"input_ids": ids[:, start:stop], "attention_mask": np.ones((ids.shape[0], stop), np.int64),
                 "position_ids": positions, **cache, **extra}
        result = sess.run(None, {k: v for k, v in feeds.items() if k in names})
        cache = dict(zip(past, result[1:]))  # present.N.* follow logits, in the order of past_key_values.N.*
        outs += result
    return outs
