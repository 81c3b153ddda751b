"""What a query reads: the attention setting of an evaluation run.

- `full`: every cached row (window 0 = the whole ring; the ring holds the whole prompt, so nothing is left out);
- `window W`: the sinks and the last W rows (StreamingLLM), as `edgeattn generate --window W`;
- `budget N`: N rows in all, split by `AttentionBudget.from_total` into the sinks, a recent window (`recent`
  of the non-sink rows, in whole pages) and the k pages whose key bounds score highest for the query (Quest).

`prompt`: what the prompt reads, "budget" (as the generated tokens: the setting holds for every query) or
"whole" (every cached row; the setting bounds the generated tokens only, Quest's setting).

`rows(layout)` is what a generated token reads at most, the x axis of the sweep's plot: a window of W reads
sinks + W.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeattn.attention.budget import DEFAULT_PAGE, DEFAULT_RECENT, AttentionBudget
from edgeattn.attention.ring import RingLayout
from edgeattn.errors import ConfigError

KINDS = ("full", "window", "budget")
PROMPTS = ("budget", "whole")


@dataclass(frozen=True)
class AttentionSetting:
    kind: str = "full"
    size: int = 0  # window: W; budget: N rows in all; full: 0
    recent: float = DEFAULT_RECENT  # budget: share of the non-sink rows given to the recent window
    prompt: str = "budget"  # what the prompt reads: "budget" (the setting) or "whole" (every cached row)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"attention setting: expected one of {', '.join(KINDS)}, found {self.kind!r}")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ConfigError(f"{self.kind}: expected an integer number of rows >= 0, found {self.size!r}")
        if self.kind != "full" and self.size < 1:
            raise ConfigError(f"{self.kind}: expected at least 1 row, found {self.size}")
        if self.kind == "full" and self.size:
            raise ConfigError(f"full attention reads every row: expected no size, found {self.size}")
        if isinstance(self.recent, bool) or not isinstance(self.recent, (int, float)) or not 0 <= self.recent <= 1:
            raise ConfigError(f"budget recent share: expected a fraction from 0 to 1, found {self.recent!r}")
        if self.prompt not in PROMPTS:
            raise ConfigError(f"prompt attention: expected one of {', '.join(PROMPTS)}, found {self.prompt!r}")

    @property
    def label(self) -> str:
        if self.kind == "full":
            return "full"
        whole = ", prompt whole" if self.prompt == "whole" else ""
        if self.kind == "window":
            return f"window {self.size}" + (f" ({whole[2:]})" if whole else "")
        return f"budget {self.size} ({self.recent:.0%} recent{whole})"

    def live(self, layout: RingLayout, page: int = DEFAULT_PAGE) -> int | AttentionBudget:
        """What the engine reads every step: a window (int, 0 = the whole ring) or an AttentionBudget with pages
        of `page` rows (the model's)."""
        if self.kind == "full":
            return 0
        if self.kind == "window":
            return layout.check_window(self.size)
        return AttentionBudget.from_total(layout, self.size, page=page, recent=self.recent)

    def rows(self, layout: RingLayout, context: int, page: int = DEFAULT_PAGE) -> int:
        """Rows a query reads at most, with a stream of `context` tokens."""
        if self.kind == "full":
            return context
        if self.kind == "window":
            return min(context, layout.sinks + self.size)
        return min(context, self.live(layout, page).rows)

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "size": self.size}
        out |= {"recent": self.recent} if self.kind == "budget" else {}
        return out | ({"prompt": self.prompt} if self.prompt != "budget" else {})
