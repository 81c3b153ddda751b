"""The attention budget as a run-time control, on fake backends (fast): the engine reads a window or a budget
(window W + k pages) once a step, a request's budget caps it for that stream alone, every event says what it
ran with, the metrics gauges read it, and the thermal controller splits each level's rows between the window and
retrieval pages.

The fake backend's next token is a function of the last id and the (window, pages) of the call, so a stream that
ran with another stream's budget gives other tokens; it records (stream, window, pages) for every row of every
call."""

from __future__ import annotations

import numpy as np
import pytest

from edgeattn.attention.budget import AttentionBudget
from edgeattn.attention.ring import RingLayout
from edgeattn.errors import ConfigError
from edgeattn.runtime.generation.cache import KVCache
from edgeattn.runtime.generation.engine import Engine, budget_rows, capped_budget, live_budget, new_job
from edgeattn.runtime.generation.generator import GenerationConfig, Generator
from edgeattn.runtime.generation.sampling import SamplingConfig
from edgeattn.runtime.live_window import LiveWindow

VOCAB, SINKS, RING = 64, 4, 64


class WindowOnly:
    """A DecoderBackend whose step takes no `pages` (as every backend before the budget)."""

    eos, vocab_size, codec = frozenset(), VOCAB, None

    def __init__(self) -> None:
        self.layout = RingLayout(SINKS, RING)
        self.rows: list[tuple[int, int, int]] = []  # (stream, window, pages) per row per call
        self.calls: list[tuple[tuple[int, ...], int, int]] = []  # (streams, window, pages) per call

    def activate(self):
        return self

    def deactivate(self) -> None:
        pass

    def new_cache(self, streams: int = 1) -> KVCache:
        return KVCache(layers=1, kv_heads=1, head_dim=1, layout=self.layout, streams=streams)

    def check_window(self, window: int) -> int:
        return self.layout.check_window(window)

    def step(self, cache, streams, ids, window, *, last_only=False):
        return self._logits(cache, streams, ids, window, 0)

    def _logits(self, cache, streams, ids, window, pages):
        ids = np.asarray(ids)
        self.calls.append((tuple(streams), int(window), int(pages)))
        logits = np.zeros((len(streams), 1, VOCAB), np.float32)
        for row, s in enumerate(streams):
            self.rows.append((s, int(window), int(pages)))
            logits[row, 0, (int(ids[row, -1]) * 7 + int(window) + 3 * int(pages)) % (VOCAB - 1) + 1] = 1.0
        cache.positions[np.asarray(streams)] += ids.shape[1]
        return logits


class Paged(WindowOnly):
    """A backend that reads retrieval pages."""

    def step(self, cache, streams, ids, window, *, last_only=False, pages=0):
        return self._logits(cache, streams, ids, window, pages)


GREEDY = SamplingConfig(temperature=0.0)


def _run(model, jobs, live, slots=None):
    """Every job to its end in one engine of `slots` slots; {job index: [events]}."""
    events: dict[int, list] = {i: [] for i in range(len(jobs))}
    index = {id(j): i for i, j in enumerate(jobs)}
    engine = Engine(model, slots=slots or len(jobs), prefill_chunk=8, window=lambda: live,
                    deliver=lambda batch: [events[index[id(j)]].append(e) for j, e in batch])
    for job in jobs:
        engine.add(job)
    while any(j.finish_reason is None for j in jobs):
        engine.step()
    engine.flush()
    return events


def _job(model, prompt, budget=None, max_tokens=12):
    return new_job(model.layout, prompt, max_tokens=max_tokens, sampling=GREEDY, budget=budget)


def _tokens(events):
    return [e.token for e in events if e.tokens]


PROMPTS = [[5, 9, 11], [17, 2], [33, 3, 8, 21], [40]]


def test_a_window_alone_reaches_a_backend_without_pages_as_before():
    model = WindowOnly()
    by_int = _run(model, [_job(model, p) for p in PROMPTS], 32)
    calls_int = list(model.calls)
    model.calls.clear()
    by_budget = _run(model, [_job(model, p) for p in PROMPTS], AttentionBudget(32, 0))
    assert [_tokens(e) for e in by_int.values()] == [_tokens(e) for e in by_budget.values()]
    assert model.calls == calls_int and {(w, k) for _, w, k in calls_int} == {(32, 0)}
    assert all(e.window == 32 and e.budget == SINKS + 32 for es in by_int.values() for e in es)


def test_pages_reach_the_backend_and_every_event_says_the_budget():
    model = Paged()
    events = _run(model, [_job(model, p) for p in PROMPTS], AttentionBudget(16, 2))
    assert {(w, k) for _, w, k in model.rows} == {(16, 2)}
    assert all(e.window == 16 and e.budget == SINKS + 16 + 2 * 16 for es in events.values() for e in es)


class Chunked(Paged):
    """Paged, and every call's chunk length."""

    def step(self, cache, streams, ids, window, *, last_only=False, pages=0):
        self.lengths = getattr(self, "lengths", []) + [np.asarray(ids).shape[1]]
        return super().step(cache, streams, ids, window, last_only=last_only, pages=pages)


def test_a_whole_prompt_reads_every_row_and_the_generated_tokens_keep_the_budget():
    """prompt_attention "whole": prompt chunks run with window 0 and no pages (the whole cache), every decode step
    with the budget; the default runs every call with the budget."""
    live, prompt = AttentionBudget(16, 2), list(range(1, 21))  # a 20-token prompt: chunks of 8, 8, 4
    for mode, want_prompt in (("whole", (0, 0)), ("budget", (16, 2))):
        model = Chunked()
        job = _job(model, prompt, max_tokens=4)
        engine = Engine(model, slots=1, prefill_chunk=8, window=lambda: live, deliver=lambda batch: None,
                        prompt_attention=mode)
        engine.add(job)
        while job.finish_reason is None:
            engine.step()
        calls = list(zip(model.lengths, [(w, k) for _, w, k in model.calls]))
        assert calls[:3] == [(8, want_prompt), (8, want_prompt), (4, want_prompt)], (mode, calls)
        assert [c for c in calls[3:]] == [(1, (16, 2))] * 3, (mode, calls)  # the first token came from the prompt
    with pytest.raises(ConfigError, match="prompt_attention: expected one of budget, whole, found 'all'"):
        GenerationConfig(prompt_attention="all")


def test_the_generator_passes_prompt_attention_to_the_engine():
    model = Chunked()
    Generator(model).generate(list(range(1, 12)), GenerationConfig(max_tokens=3, prefill_chunk=8,
                                                                    prompt_attention="whole"),
                              window=AttentionBudget(16, 2))
    assert [(n, w, k) for n, (_, w, k) in zip(model.lengths, model.calls)] == [(8, 0, 0), (3, 0, 0), (1, 16, 2),
                                                                              (1, 16, 2)]


def test_a_backend_without_pages_refuses_a_budget_with_pages_before_any_work():
    model = WindowOnly()
    with pytest.raises(ConfigError, match="reads the window only"):
        next(Generator(model).stream([5, 9], GenerationConfig(max_tokens=2), window=AttentionBudget(16, 2)))
    assert model.calls == []


@pytest.mark.parametrize("live", [AttentionBudget(48, 1), AttentionBudget(0, 0), 40])
def test_per_request_budgets_in_one_batch_do_not_change_each_others_tokens(live):
    """Each stream equals itself run alone with its own budget; rows of two budgets never share a call."""
    model = Paged()
    budgets = [None, 36, 20, 52]
    together = _run(model, [_job(model, p, b) for p, b in zip(PROMPTS, budgets)], live)
    for call_streams, window, pages in model.calls:
        assert len({capped(live, budgets[s]) for s in call_streams}) == 1, model.calls
    for i, (prompt, budget) in enumerate(zip(PROMPTS, budgets)):
        alone_model = Paged()
        alone = _run(alone_model, [_job(alone_model, prompt, budget)], live)[0]
        assert _tokens(together[i]) == _tokens(alone)
        want = capped(live, budget)
        assert {(w, k) for _, w, k in alone_model.rows} == {(want.window, want.pages)}
        assert together[i][-1].budget == budget_rows(model.layout, want)


def capped(live, budget):
    return capped_budget(RingLayout(SINKS, RING), live_budget(Paged(), live), budget)


def test_a_request_budget_caps_the_live_one_and_keeps_its_split():
    layout, model = RingLayout(SINKS, RING), Paged()
    live = live_budget(model, AttentionBudget(16, 3))  # 4 + 16 + 48 = 68 rows, a quarter of them recent
    assert capped_budget(layout, live, 68) == live and capped_budget(layout, live, None) == live
    assert capped_budget(layout, live, 36) == AttentionBudget.from_total(layout, 36, recent=0.25)
    window = live_budget(model, 40)  # a window stays a window: the rows above the sinks
    assert capped_budget(layout, window, 20) == AttentionBudget(16, 0, 16, SINKS)
    assert live_budget(model, 1000) == AttentionBudget(0, 0, 16, SINKS)  # beyond the ring: the whole ring
    assert live_budget(model, AttentionBudget(48, 5)).pages == 1  # pages beyond the ring are dropped


@pytest.mark.parametrize("bad, match", [(True, "expected an integer"), (20.0, "expected an integer"),
                                        ("64", "expected an integer"), (19, "expected 20"), (69, "to 68")])
def test_a_job_budget_outside_the_cache_is_refused(bad, match):
    with pytest.raises(ConfigError, match=match):
        new_job(RingLayout(SINKS, RING), [1, 2], max_tokens=2, sampling=GREEDY, budget=bad)


def test_live_window_holds_the_pages_and_reports_them():
    window = LiveWindow(0, max_window=RING)
    assert window.budget() == AttentionBudget(0, 0)
    assert window.set(16, source="controller", reason="hot", pages=3)
    assert window.budget() == AttentionBudget(16, 3) and window.pages == 3
    change = window.history[-1]
    assert (change.old, change.new, change.old_pages, change.pages) == (0, 16, 0, 3)
    window.set(32)  # a window alone: no pages
    assert window.budget() == AttentionBudget(32, 0)
    with pytest.raises(ConfigError, match="pages: expected an integer >= 0"):
        window.set(16, pages=-1)


def test_the_metrics_gauges_read_the_live_budget_at_each_scrape():
    from prometheus_client import CollectorRegistry, generate_latest

    from edgeattn.runtime.server.metrics import GenerationMetrics

    registry = CollectorRegistry()
    window = LiveWindow(0, max_window=RING)
    Engine(Paged(), slots=1, prefill_chunk=8, window=window.budget, deliver=lambda batch: None,
           metrics=GenerationMetrics(registry), model_name="m")

    def scrape():
        text = generate_latest(registry).decode()
        return [float(line.split()[-1]) for name in ("rows", "pages") for line in text.splitlines()
                if line.startswith(f'edgeattn_attention_budget_{name}{{model="m"}}')]

    assert scrape() == [SINKS + RING, 0.0]
    window.set(16, pages=2)
    assert scrape() == [SINKS + 16 + 32, 2.0]


# --- the thermal controller: a level's rows split between the window and the pages -------------------------
def test_budget_for_splits_a_level_and_keeps_window_policies_as_they_were():
    from edgeattn.runtime.thermal.controller import budget_for, window_for
    from edgeattn.runtime.thermal.policies import BudgetSplit

    for fraction in (1.0, 0.5, 0.25, 0.001):
        assert budget_for(fraction, 1024) == (window_for(fraction, 1024), 0)
    split = BudgetSplit(recent=0.25)
    assert budget_for(1.0, 1024, split) == (0, 0)  # full attention reads every row anyway
    assert budget_for(0.5, 1024, split) == (128, 24)  # 512 rows: 128 recent + 24 pages of 16
    assert budget_for(0.25, 1024, split) == (64, 12)
    assert budget_for(0.001, 1024, split) == (16, 0)  # at least one page, all of it recent


def test_the_controller_sets_the_split_budget_as_the_device_heats():
    from edgeattn.runtime.thermal.controller import ThermalController
    from edgeattn.runtime.thermal.policies import BudgetSplit, StepPolicy
    from edgeattn.runtime.thermal.readings import Reading

    class Sensor:
        trip_c = 99.0

        def __init__(self):
            self.temp = 60.0

        def read(self):
            return Reading(t=0.0, temps={"gpu": self.temp}, trip_c=self.trip_c)

        def close(self):
            pass

    sensor, window = Sensor(), LiveWindow(0, max_window=1024)
    policy = StepPolicy(thresholds_c=(75, 85), budget=BudgetSplit(recent=0.25))
    controller = ThermalController(sensor, policy, window, 1024, clock=lambda: 0.0)
    controller.step()
    assert window.budget() == AttentionBudget(0, 0)
    sensor.temp = 80.0
    controller.step()
    assert window.budget() == AttentionBudget(128, 24)
    sensor.temp = 90.0
    controller.step()
    assert window.budget() == AttentionBudget(64, 12)
    snapshot = controller.metrics_snapshot()
    assert (snapshot["window"], snapshot["budget_pages"], snapshot["budget_fraction"]) == (64, 12, 0.25)
    with pytest.raises(ConfigError, match="divisor"):
        ThermalController(sensor, policy, LiveWindow(0), 1000)  # pages of 16 do not cut 1000 rows


def test_policy_files_keep_their_format_and_take_a_budget(tmp_path):
    from edgeattn.runtime.thermal.policies import BudgetSplit, StepPolicy
    from edgeattn.runtime.thermal.policy_file import load_policy, policy_from_dict, save_policy

    old = tmp_path / "old.toml"
    old.write_text('kind = "step"\nlevels = [1.0, 0.5, 0.25]\nthresholds_c = [75, 85]\n')
    assert load_policy(old).budget == BudgetSplit()
    save_policy(load_policy(old), tmp_path / "again.toml")
    assert "budget" not in (tmp_path / "again.toml").read_text()  # a window policy is written as before
    split = tmp_path / "split.toml"
    split.write_text('kind = "step"\nthresholds_c = [75, 85]\nbudget = {recent = 0.25}\n')
    policy = load_policy(split)
    assert policy.budget == BudgetSplit(recent=0.25)
    save_policy(policy, tmp_path / "saved.toml")
    assert load_policy(tmp_path / "saved.toml") == policy
    assert policy_from_dict({"policy": {"kind": "step", "budget": {"recent": 0.5}}}).budget.recent == 0.5
    (tmp_path / "split.yaml").write_text("kind: step\nbudget: {recent: 0.25}\n")
    assert load_policy(tmp_path / "split.yaml").budget == BudgetSplit(recent=0.25)
    for bad, match in [(0.25, "expected a table"), ({"recnt": 0.2}, "unknown keys recnt"),
                       ({"recent": 1.5}, "fraction from 0 to 1"), ({"page": 0}, "positive integer")]:
        with pytest.raises(ConfigError, match=match):
            policy_from_dict({"kind": "step", "budget": bad})
    assert StepPolicy() == policy_from_dict({"kind": "step"})


def test_serve_says_the_live_budget_at_start_up():
    from types import SimpleNamespace

    from edgeattn.cli.serve_cmd import _budget_line
    from edgeattn.runtime.thermal.policies import BudgetSplit

    def decoder(value):
        engine = Engine(Paged(), slots=1, prefill_chunk=8, window=lambda: value, deliver=lambda batch: None)
        return SimpleNamespace(name="dec", layout=engine.model.layout, scheduler=SimpleNamespace(engine=engine))

    assert _budget_line(decoder(0), None) == ("attention budget of dec: 68 rows (4 sinks + the whole ring of 64); "
                                              "a request's attention_budget caps it")
    controller = SimpleNamespace(split=BudgetSplit(recent=0.25))
    assert _budget_line(decoder(AttentionBudget(16, 2)), controller) == (
        "attention budget of dec: 52 rows (4 sinks + window 16 + 2 pages of 16); the thermal policy moves it "
        "(recent share 0.25); a request's attention_budget caps it")


def test_serve_takes_prompt_attention_from_its_settings_into_the_engine():
    from edgeattn.runtime.server.scheduler import SlotScheduler
    from edgeattn.runtime.server.settings import ServeSettings

    assert ServeSettings.from_env({"EDGEATTN_SERVE_PROMPT_ATTENTION": "whole"}).prompt_attention == "whole"
    with pytest.raises(ConfigError, match="prompt_attention: expected one of budget, whole, found 'all'"):
        ServeSettings(prompt_attention="all")
    scheduler = SlotScheduler(Paged(), slots=2, max_queue=4, prefill_chunk=8, window=lambda: 0,
                              deliver=lambda batch: None, prompt_attention="whole")
    assert scheduler.engine.prompt_attention == "whole"
