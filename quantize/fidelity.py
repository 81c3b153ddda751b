"""Fidelity of a lossy model against the float one: sentence-embedding cosine (encoders), perplexity
(decoders). Models are callables batch -> output tensor, so torch and ONNX Runtime compare alike.

`Probe` is the check every lossy stage (quantize, sparsify) runs: the float model's reference on held-out
text is measured before the stage changes the model, the result after; `check_floor` fails the stage
below a floor, and `far_from_full_run` says when the result is far from what a longer run gives."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from edgeattn import text
from edgeattn.errors import ConfigError, FidelityError
from edgeattn.quantize.distillation import pool

Forward = Callable[[dict], object]  # batch -> torch tensor: last_hidden_state (encoders) or logits (decoders)


def torch_forward(model, kind: str) -> Forward:
    import torch

    def run(batch):
        with torch.no_grad():
            if kind == "decoder":
                return model(**batch, use_cache=False).logits
            return model(**batch).last_hidden_state
    return run


def onnx_forward(path, threads: int = 0) -> Forward:
    import onnxruntime as ort
    import torch

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return lambda batch: torch.from_numpy(sess.run(None, {n: batch[n].numpy() for n in names})[0])


def embeddings(forward: Forward, batches):
    """Normalised mean-pooled embeddings [N, H] of every sentence in `batches`."""
    import torch

    return torch.cat([pool(forward(b).float(), b["attention_mask"]) for b in batches])


def embedding_cosines(reference: Forward, candidate: Forward, batches):
    """Per-sentence cosine between the two models' normalised mean-pooled embeddings."""
    batches = list(batches)
    return (embeddings(reference, batches) * embeddings(candidate, batches)).sum(-1).numpy()


def perplexity(forward: Forward, chunks, batch_size: int = 4) -> float:
    """Perplexity over token chunks [N, S] (every position predicts the next)."""
    import torch

    nll, count = 0.0, 0
    for i in range(0, chunks.shape[0], batch_size):
        ids = chunks[i:i + batch_size]
        logits = forward({"input_ids": ids, "attention_mask": torch.ones_like(ids)}).float()
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 ids[:, 1:].reshape(-1), reduction="sum")
        nll += loss.item()
        count += ids[:, 1:].numel()
    return math.exp(nll / count)


HELDOUT_SENTENCES = 64  # encoders: the first 64 polarity sentences (about a second on a laptop core)
HELDOUT_CHUNKS, HELDOUT_SEQ = 4, 128  # decoders: 4 chunks of 128 tokens of lee.cor
# A result this far off says "run longer": mean cosine below, perplexity increase (%) above.
FAR = {"encoder": 0.95, "decoder": 25.0}
FULL_RUN = {  # what longer runs reached (docs/quantization.md, docs/sparsity.md)
    ("quantize", "encoder"): "MiniLM W8A8 reaches a mean cosine of 0.995 after 150 QAT steps on a CPU",
    ("quantize", "decoder"): "SmolLM2 W8A8 reaches +1% perplexity with --smooth 0.85 and 600 QAT steps",
    ("sparsify", "encoder"): "MiniLM 2:4 reaches a mean cosine of 0.97 after 6000 fine-tuning steps of 512 "
                             "generated sentences (6 minutes on an H200)",
    ("sparsify", "decoder"): "SmolLM2 2:4 reaches +21% perplexity after 3328 fine-tuning steps of 32 x 512 tokens "
                             "on an H200",
}
HOW_TO_GET_CLOSER = {
    "quantize": "raise --steps and give more --calib text",
    "sparsify": "fine-tune longer (--finetune-steps, or --time-budget-s with --device cuda) on more text "
                "(--calib, e.g. written by edgeattn distill-text)",
}


def check_floor_kind(kind: str, min_cosine: float | None, max_ppl_increase: float | None) -> None:
    """A cosine floor is for encoders, a perplexity ceiling for decoders: ConfigError for the wrong one."""
    if kind == "decoder" and min_cosine is not None:
        raise ConfigError("min_cosine: expected an encoder (sentence-embedding cosine), found a decoder; "
                          "use max_ppl_increase for a causal LM")
    if kind != "decoder" and max_ppl_increase is not None:
        raise ConfigError("max_ppl_increase: expected a decoder (causal LM), found an encoder; "
                          "use min_cosine for an encoder")


def check_floor_values(min_cosine: float | None, max_ppl_increase: float | None) -> None:
    if min_cosine is not None and not -1.0 <= min_cosine <= 1.0:
        raise ConfigError(f"min_cosine: expected -1 <= cosine <= 1, found {min_cosine}")
    if max_ppl_increase is not None and not max_ppl_increase >= 0:
        raise ConfigError(f"max_ppl_increase: expected a percentage >= 0, found {max_ppl_increase}")


@dataclass
class Probe:
    """Held-out text and the float model's reference on it (embeddings or perplexity)."""

    kind: str
    description: str
    batches: list  # encoders: tokenized sentence batches
    chunks: object  # decoders: token chunks [N, S]
    reference: object  # encoders: [N, H] embeddings; decoders: perplexity

    @classmethod
    def measure(cls, model, tokenizer, kind: str, texts: list[str] | None = None) -> "Probe":
        """Measure the float `model` (call before the stage changes it) on `texts` or the default held-out text."""
        if kind == "decoder":
            docs = texts or text.lee_heldout_documents()
            chunks = text.token_chunks(tokenizer, docs, HELDOUT_SEQ, max_chunks=HELDOUT_CHUNKS)
            if chunks.shape[0] == 0:
                raise ConfigError(f"held-out text: expected at least {HELDOUT_SEQ} tokens, found fewer")
            where = "held-out text" if texts else "gensim lee.cor (held out)"
            probe = cls(kind, f"{chunks.shape[0]} chunks of {HELDOUT_SEQ} tokens of {where}", [], chunks, None)
            probe.reference = perplexity(probe._forward(model), chunks)
            return probe
        sentences = (texts or text.polarity_sentences())[:HELDOUT_SENTENCES]
        where = "held-out text" if texts else "gensim pang_lee_polarity (held out)"
        batches = list(text.eval_batches(tokenizer, sentences, 16, HELDOUT_SEQ))
        probe = cls(kind, f"{len(sentences)} sentences of {where}", batches, None, None)
        probe.reference = embeddings(probe._forward(model), batches)
        return probe

    def _forward(self, model) -> Forward:
        run = torch_forward(model, self.kind)
        device = next(model.parameters()).device
        return lambda batch: run({k: v.to(device) for k, v in batch.items()}).cpu()

    def compare(self, model) -> dict:
        """The lossy `model` against the reference: cos_mean / cos_min, or ppl / ppl_float / ppl_increase_pct."""
        if self.kind == "decoder":
            ppl = perplexity(self._forward(model), self.chunks)
            return {"metric": "perplexity", "ppl_float": self.reference, "ppl": ppl,
                    "ppl_increase_pct": 100.0 * (ppl / self.reference - 1.0), "text": self.description}
        c = (self.reference * embeddings(self._forward(model), self.batches)).sum(-1).numpy()
        return {"metric": "cosine", "cos_mean": float(c.mean()), "cos_min": float(c.min()), "n": int(c.size),
                "text": self.description}

    def check(self, model, stage: str, min_cosine: float | None, max_ppl_increase: float | None,
              progress: Callable[[str], None]) -> dict:
        """`compare`, with the floors and far_from_full_run recorded beside the result; reports it through
        `progress` and raises FidelityError when it is below the floor. Returns the record."""
        measured = self.compare(model)
        measured.update(min_cosine=min_cosine, max_ppl_increase=max_ppl_increase,
                        far_from_full_run=far_from_full_run(measured))
        progress(f"fidelity: {describe(measured)}")
        check_floor(measured, stage, min_cosine, max_ppl_increase)
        return measured


def describe(measured: dict) -> str:
    if measured["metric"] == "perplexity":
        return (f"perplexity {measured['ppl']:.2f} vs {measured['ppl_float']:.2f} float "
                f"({measured['ppl_increase_pct']:+.1f}%) on {measured['text']}")
    return (f"embedding cosine to the float model: mean {measured['cos_mean']:.7g}, min {measured['cos_min']:.7g} "
            f"on {measured['text']}")


def check_floor(measured: dict, stage: str, min_cosine: float | None, max_ppl_increase: float | None) -> None:
    """FidelityError when the result is below the floor."""
    if min_cosine is not None and measured["cos_mean"] < min_cosine:
        raise FidelityError(f"{stage}: expected a mean embedding cosine >= {min_cosine} (--min-cosine), found "
                            f"{measured['cos_mean']:.7g} on {measured['text']}; nothing was written")
    if max_ppl_increase is not None and measured["ppl_increase_pct"] > max_ppl_increase:
        raise FidelityError(f"{stage}: expected a perplexity increase <= {max_ppl_increase}% (--max-ppl-increase), "
                            f"found {measured['ppl_increase_pct']:+.1f}% on {measured['text']}; nothing was written")


def far_from_full_run(measured: dict) -> bool:
    if measured["metric"] == "perplexity":
        return measured["ppl_increase_pct"] > FAR["decoder"]
    return measured["cos_mean"] < FAR["encoder"]


def far_warning(measured: dict, stage: str, ran: str) -> str | None:
    """A plain warning when the result is far from what a full run gives (None when it is not)."""
    if not far_from_full_run(measured):
        return None
    kind = "decoder" if measured["metric"] == "perplexity" else "encoder"
    return (f"warning: {describe(measured)}: far from what a longer run gives ({FULL_RUN[(stage, kind)]}); "
            f"this run: {ran}. To get closer, {HOW_TO_GET_CLOSER[stage]}.")
