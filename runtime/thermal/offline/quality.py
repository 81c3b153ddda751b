"""Window -> quality: how much a smaller attention window costs, per model.

The shipped table (quality_smollm2.json, package data) holds SmolLM2-135M perplexity per window with 4 sink
tokens on held-out news text (gensim's lee.cor, 512-token chunks), measured by `measure_perplexity` with
edgeattn's windowed attention swapped into the model (`edgeattn.attention.hf_attention`), the text from
`edgeattn.text` and the model from `edgeattn.hf_models`. `quality(fraction)` = ppl(full) / ppl(window),
interpolated in log2(window), and never higher than at a larger window (differences inside measurement
noise are not a reason to shrink).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from edgeattn.errors import InputError

DEFAULT_TABLE = "quality_smollm2.json"


@dataclass(frozen=True)
class QualityTable:
    model: str
    metric: str  # "perplexity" (lower is better) or "cosine" (higher is better)
    max_window: int
    sinks: int
    full: float
    windows: dict[int, float]  # window -> metric value

    def quality(self, fraction: float) -> float:
        """Relative quality in (0, 1] at `fraction` of max_window (1.0 = full attention)."""
        if fraction >= 1.0:
            return 1.0
        points = sorted(self.windows.items())
        w = max(fraction * self.max_window, 1.0)
        if w >= self.max_window:
            return 1.0
        xs = [math.log2(k) for k, _ in points] + [math.log2(self.max_window)]
        ys = [self._relative(v) for _, v in points] + [1.0]
        for i in range(len(ys) - 2, -1, -1):  # a smaller window never counts as better (noise in the table)
            ys[i] = min(ys[i], ys[i + 1])
        x = math.log2(w)
        if x <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if x <= x1:
                return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return 1.0

    def _relative(self, value: float) -> float:
        return min(self.full / value, 1.0) if self.metric == "perplexity" else min(value / self.full, 1.0)

    def to_dict(self) -> dict:
        return {"model": self.model, "metric": self.metric, "max_window": self.max_window, "sinks": self.sinks,
                "full": self.full, "windows": {str(k): v for k, v in sorted(self.windows.items(), reverse=True)}}


def table_from_dict(data: dict, source: str = "quality table") -> QualityTable:
    try:
        return QualityTable(model=str(data["model"]), metric=str(data["metric"]), max_window=int(data["max_window"]),
                            sinks=int(data["sinks"]), full=float(data["full"]),
                            windows={int(k): float(v) for k, v in data["windows"].items()})
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{source}: expected model, metric, max_window, sinks, full, windows: {exc}") from exc


def load_table(path: Path | None = None) -> QualityTable:
    """The given JSON table, or the one shipped in the package."""
    if path is None:
        text = resources.files("edgeattn.runtime.thermal").joinpath(DEFAULT_TABLE).read_text()
        return table_from_dict(json.loads(text), DEFAULT_TABLE)
    path = Path(path)
    if not path.is_file():
        raise InputError(f"quality table {path}: file not found")
    return table_from_dict(json.loads(path.read_text()), str(path))


def measure_perplexity(model: str = "smollm2", windows: tuple[int, ...] = (256, 128, 64, 32), sinks: int = 4,
                       seq: int = 512, chunks: int = 4) -> QualityTable:
    """Perplexity of a causal LM at full attention and at each window, on `chunks` chunks of `seq` held-out
    tokens, with edgeattn's windowed attention swapped in (imports torch and transformers)."""
    from edgeattn import hf_models
    from edgeattn.attention.hf_attention import WINDOW_KWARG, use_windowed_attention
    from edgeattn.optional import require
    from edgeattn import text

    torch = require("torch", "measuring the window -> quality table")
    lm, tokenizer, kind = hf_models.load(model)
    if kind != "decoder":
        raise InputError(f"{model}: expected a causal language model, found an encoder")
    data = text.token_chunks(tokenizer, text.lee_heldout_documents(), seq, max_chunks=chunks)  # [N, seq]
    if data.shape[0] < chunks:
        raise InputError(f"held-out text: expected {chunks} chunks of {seq} tokens, found {data.shape[0]}")
    use_windowed_attention(lm, sinks=sinks)
    results: dict[int, float] = {}
    for window in (0, *windows):
        losses = []
        with torch.inference_mode():
            for row in data:
                losses.append(float(lm(row[None], labels=row[None], **{WINDOW_KWARG: window}).loss))
        results[window] = math.exp(sum(losses) / len(losses))
    full = results.pop(0)
    return QualityTable(model=model, metric="perplexity", max_window=seq, sinks=sinks, full=full, windows=results)
