"""The text a task hides its needles in, and a prompt assembled at a target size in tokens.

The filler is the passkey test's noise (Mohtashami and Jaggi, arXiv 2305.16300): five plain sentences
repeated, so nothing in it competes with a needle. A prompt is an instruction, the haystack (filler sentences
with needles between them, each at its depth: 0 = before all the filler, 1 = after it) and a question.
It takes one of two forms (`FORMS`):

- `chat`: the instruction, the haystack and the question as one user message, sent in the model's chat template;
- `raw`: a plain completion (no template), the question followed by an answer prefix ("... What is the pass
  key? The pass key is") that the model completes, as in the original passkey test.

`fit` finds the largest number of filler sentences whose whole prompt, as the model sees it, has at most the
target number of tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edgeattn.errors import ConfigError

FILLER = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")

# Keys of the multi-key task are "adjective-noun" pairs (RULER's niah_multikey), drawn from these.
ADJECTIVES = ("amber", "brave", "calm", "dusty", "eager", "fancy", "gentle", "hollow", "icy", "jolly", "keen",
              "lively", "mellow", "noble", "odd", "plain", "quiet", "rapid", "silky", "tidy", "upper", "vivid",
              "wary", "young", "zesty", "bold", "crisp", "dark", "early", "faint")
NOUNS = ("anchor", "barrel", "candle", "dragon", "engine", "falcon", "garden", "harbor", "island", "jacket",
         "kettle", "ladder", "magnet", "needle", "orange", "pencil", "quartz", "rocket", "saddle", "tunnel",
         "umbrella", "valley", "window", "yogurt", "zipper", "bridge", "cactus", "desert", "forest", "glacier")

FORMS = ("chat", "raw")

Counter = Callable[[str], int]  # a message (chat) or prompt text (raw) -> tokens of the whole prompt the model reads


@dataclass(frozen=True)
class Needle:
    depth: float  # 0 = before the filler, 1 = after it
    text: str


@dataclass(frozen=True)
class Parts:
    instruction: str
    needles: tuple[Needle, ...]
    question: str
    answer_prefix: str = ""  # raw form: the text the model completes with the answer
    form: str = "chat"

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ConfigError(f"prompt form: expected one of {', '.join(FORMS)}, found {self.form!r}")

    def haystack(self, sentences: int) -> str:
        """`sentences` filler sentences with every needle placed at its depth (in needle order at ties)."""
        filler = [FILLER[i % len(FILLER)] for i in range(sentences)]
        slots: dict[int, list[str]] = {}
        for needle in self.needles:
            slots.setdefault(round(needle.depth * sentences), []).append(needle.text)
        out: list[str] = []
        for i in range(sentences + 1):
            out.extend(slots.get(i, ()))
            if i < sentences:
                out.append(filler[i])
        return " ".join(out)

    def message(self, sentences: int) -> str:
        """The user message (chat form) or the whole prompt text, ending with the answer prefix (raw form)."""
        if self.form == "raw":
            return f"{self.instruction} {self.haystack(sentences)} {self.question} {self.answer_prefix}"
        return f"{self.instruction}\n\n{self.haystack(sentences)}\n\n{self.question}"


def fit(parts: Parts, target: int, count: Counter) -> tuple[str, int]:
    """(the message with the most filler whose prompt has at most `target` tokens, its prompt tokens)."""
    bare = count(parts.message(0))
    if bare > target:
        raise ConfigError(f"context: expected room for the task's instruction, needles and question ({bare} "
                          f"tokens with the template), found a target of {target} prompt tokens")
    low, high = 0, max(1, target // 8)  # a filler sentence is 4-6 tokens: a first guess below the target
    while count(parts.message(high)) <= target:
        low, high = high, high * 2
    while high - low > 1:  # invariant: count(low) <= target < count(high)
        mid = (low + high) // 2
        if count(parts.message(mid)) <= target:
            low = mid
        else:
            high = mid
    message = parts.message(low)
    return message, count(message)
