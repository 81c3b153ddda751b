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
        inputs.append(helper.make_tensor_value_info("past", TensorProto.FLOAT, [2, "batch", HEADS, "past_seq", HEAD_DIM]))
        outputs.append(helper.make_tensor_value_info("present", TensorProto.FLOAT, [2, "batch", HEADS, "total", HEAD_DIM]))
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
