"""A decoder served on several GPUs (`edgeattn serve BUNDLE --devices`): one engine per GPU behind one model name.

Each engine is a DecoderRuntime of its own: the weights on its GPU, a slot pool sized from that GPU's memory, its
CUDA graphs, its SlotScheduler worker thread. A new request goes to the engine with the most free slots (ties: the
lowest GPU index) and stays there for its life. The group is ready when every engine is.
"""

from __future__ import annotations

import asyncio

from edgeattn.runtime.generation.sampling import SamplingConfig
from edgeattn.runtime.server.decoder_runtime import DecoderRuntime, Stream


class DecoderGroup:
    """The same face as DecoderRuntime to the routes and the app (submit, start, stop, metadata, statistics)."""

    kind = "decoder"

    def __init__(self, engines: list[DecoderRuntime]) -> None:
        if not engines:
            raise ValueError("a decoder group needs at least one engine")
        first = engines[0]
        self.engines = engines
        self.name, self.bundle, self.settings = first.name, first.bundle, first.settings
        self.model, self.plan, self.created = first.model, first.plan, first.created  # the same bundle everywhere
        self.max_tokens_limit = first.max_tokens_limit
        self.slots = sum(e.slots for e in engines)
        self._gauges(first.metrics.generation)

    def _gauges(self, g) -> None:
        """The model's gauges are the totals over the engines; the device gauges, each engine's (read at scrape)."""
        name = self.name
        cache = sum(int(getattr(e.scheduler.cache, "nbytes", 0)) for e in self.engines)
        g.slots.labels(name).set(self.slots)
        g.cache_bytes.labels(name).set(cache)
        g.slot_bytes.labels(name).set(cache // self.slots)
        g.running.labels(name).set_function(lambda: sum(e.scheduler.busy for e in self.engines))
        g.waiting.labels(name).set_function(lambda: sum(e.scheduler.depth for e in self.engines))
        for e in self.engines:
            g.device_slots.labels(name, e.device).set(e.slots)
            g.device_running.labels(name, e.device).set_function(lambda e=e: e.scheduler.busy)
            g.device_waiting.labels(name, e.device).set_function(lambda e=e: e.scheduler.depth)

    @property
    def ready(self) -> bool:
        return all(e.ready for e in self.engines)

    @property
    def codec(self):
        return self.model.codec

    @property
    def layout(self):
        return self.model.layout

    @property
    def scheduler(self):
        """The first engine's scheduler (its live attention budget is the one the start-up log states)."""
        return self.engines[0].scheduler

    def pick(self) -> DecoderRuntime:
        """The engine with the most free slots; ties go to the lowest GPU index."""
        return max(self.engines, key=lambda e: e.free_slots)  # max keeps the first of equals

    def submit(self, prompt_ids: list[int], *, max_tokens: int, sampling: SamplingConfig,
               stops: tuple[str, ...], budget: int | None = None) -> Stream:
        return self.pick().submit(prompt_ids, max_tokens=max_tokens, sampling=sampling, stops=stops, budget=budget)

    def describe(self) -> str:
        """One line per GPU."""
        return "\n".join(e.describe() for e in self.engines)

    async def start(self) -> None:
        await asyncio.gather(*(e.start() for e in self.engines))

    async def stop(self, timeout: float | None = None) -> None:
        await asyncio.gather(*(e.stop(timeout) for e in self.engines))

    def abandon(self) -> None:
        for e in self.engines:
            e.abandon()

    def metadata(self) -> dict:
        doc = self.engines[0].metadata()
        doc["parameters"] = {**doc["parameters"], "slots": self.slots, "devices": [e.device for e in self.engines]}
        return doc

    def statistics(self) -> dict:
        per = [{**e.statistics(), "device": e.device} for e in self.engines]
        return {"name": self.name, "version": "1", "slots": self.slots, "busy": sum(s["busy"] for s in per),
                "waiting": sum(s["waiting"] for s in per), "slot_moves": sum(s["slot_moves"] for s in per),
                "devices": [{k: s[k] for k in ("device", "slots", "busy", "waiting", "slot_moves", "profile")}
                            for s in per]}
