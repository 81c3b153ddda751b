"""Fidelity of a quantized model against the float one: sentence-embedding cosine (encoders),
perplexity (decoders). Models are callables batch -> output tensor, so torch and ONNX Runtime compare alike."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

Forward = Callable[[dict[str, torch.Tensor]], torch.Tensor]  # encoders: last_hidden_state; decoders: logits


def torch_forward(model, kind: str) -> Forward:
    def run(batch):
        with torch.no_grad():
            if kind == "decoder":
                return model(**batch, use_cache=False).logits
            return model(**batch).last_hidden_state
    return run


def onnx_forward(path, threads: int = 0) -> Forward:
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return lambda batch: torch.from_numpy(sess.run(None, {n: batch[n].numpy() for n in names})[0])


def embeddings(forward: Forward, batches) -> torch.Tensor:
    from edgeattn.quantize.distillation import pool

    return torch.cat([pool(forward(b).float(), b["attention_mask"]) for b in batches])


def embedding_cosines(reference: Forward, candidate: Forward, batches) -> np.ndarray:
    """Per-sentence cosine between the two models' normalised mean-pooled embeddings."""
    batches = list(batches)
    return (embeddings(reference, batches) * embeddings(candidate, batches)).sum(-1).numpy()


def perplexity(forward: Forward, chunks: torch.Tensor, batch_size: int = 4) -> float:
    """Perplexity over token chunks [N, S] (every position predicts the next)."""
    nll, count = 0.0, 0
    for i in range(0, chunks.shape[0], batch_size):
        ids = chunks[i:i + batch_size]
        logits = forward({"input_ids": ids, "attention_mask": torch.ones_like(ids)}).float()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 ids[:, 1:].reshape(-1), reduction="sum")
        nll += loss.item()
        count += ids[:, 1:].numel()
    return math.exp(nll / count)


def token_chunks(tokenizer, texts: list[str], seq_len: int, max_chunks: int | None = None) -> torch.Tensor:
    """Concatenate the texts' tokens (EOS between) and cut them into [N, seq_len] chunks."""
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for t in texts:
        stream += tokenizer(t, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
    n = len(stream) // seq_len
    if max_chunks is not None:
        n = min(n, max_chunks)
    return torch.tensor(stream[:n * seq_len], dtype=torch.long).reshape(n, seq_len)
