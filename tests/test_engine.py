"""One decode engine: `Generator` (one slot) and the server's `SlotScheduler` (many slots, a worker thread) run
the same step, so they give the same tokens and the same text; the scheduler's admission, slot moves and
failures; stop strings at any length.

A scripted backend (its next token a function of the last id fed and the stream's first token, read back from
its own cache rows) checks the rules exactly and fast; the tiny decoder bundle (random weights, SmolLM2's
tokenizer, ring 72) checks them on a real model at several windows, past the end of the ring."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from decoder_fixtures import requires_decoder_stack
from edgeattn.attention.ring import RingLayout
from edgeattn.runtime.generation.cache import KVCache
from edgeattn.runtime.generation.engine import Job, new_job
from edgeattn.runtime.generation.generator import GenerationConfig, Generator
from edgeattn.runtime.generation.sampling import SamplingConfig
from edgeattn.runtime.generation.stops import StopMatcher
from edgeattn.runtime.server.scheduler import QueueFull, SlotScheduler

EOS, VOCAB = 0, 16


class PieceCodec:
    """A tokenizer whose tokens are fixed pieces of text."""

    chat_template = None

    def __init__(self, pieces: dict[int, str]) -> None:
        self.pieces = pieces

    def decode(self, ids) -> str:
        return "".join(self.pieces.get(int(i), f" t{int(i)}") for i in ids)

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError


class ScriptedDecoder:
    """A DecoderBackend: the next token is `script[last id]`, else 6 + (last id + the stream's first token) % 8,
    where the first token is read from the stream's own cache row 0 (so a slot move that lost the rows would
    change the tokens). Token 15 is followed by end of text. `on_step(model, streams, ids)` runs at each call."""

    eos, vocab_size = frozenset({EOS}), VOCAB

    def __init__(self, pieces: dict[int, str] | None = None, script: dict[int, int] | None = None, *, sinks: int = 2,
                 window_max: int = 8, on_step=None) -> None:
        self.layout = RingLayout(sinks, window_max)
        self.codec = PieceCodec(pieces or {})
        self.script = {15: EOS, **(script or {})}
        self.on_step, self.calls = on_step, 0

    def activate(self):
        return self

    def deactivate(self) -> None:
        pass

    def new_cache(self, streams: int = 1) -> KVCache:
        return KVCache(layers=1, kv_heads=1, head_dim=1, layout=self.layout, streams=streams)

    def check_window(self, window: int) -> int:
        if not 0 <= window <= self.layout.window_max:
            raise ValueError(f"window {window}")
        return window

    def step(self, cache, streams, ids, window, *, last_only=False):
        ids = np.asarray(ids)
        self.calls += 1
        if self.on_step is not None:
            self.on_step(self, list(streams), ids)
        logits = np.full((len(streams), 1, VOCAB), -10.0, np.float32)
        for row, s in enumerate(streams):
            n = int(cache.positions[s])
            cache.keys[0][s, 0, self.layout.slots(np.arange(n, n + ids.shape[1])), 0] = ids[row]
            cache.positions[s] += ids.shape[1]
            logits[row, 0, self.next_token(int(ids[row, -1]), int(cache.keys[0][s, 0, 0, 0]))] = 10.0
        return logits

    def next_token(self, last: int, first: int) -> int:
        return self.script.get(last, 6 + (last + first) % 8)


class DeviceSampler(ScriptedDecoder):
    """The same model choosing its tokens itself (greedy), as a GPU backend that samples on the device would."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.sampled_calls = 0

    def step_sample(self, cache, streams, ids, window, sampling):
        self.sampled_calls += 1
        assert len(sampling) == len(streams) and all(isinstance(c, SamplingConfig) for c in sampling)
        return self.step(cache, streams, ids, window, last_only=True)[:, -1].argmax(-1).astype(np.int64)


class Served:
    """A SlotScheduler over a backend, its events collected per job."""

    def __init__(self, model, *, slots: int = 4, max_queue: int = 8, prefill_chunk: int = 8, window: int = 0,
                 prefill_in_step: int = 0, metrics=None) -> None:
        self.model, self.events = model, {}
        self.lock = threading.Lock()
        self.scheduler = SlotScheduler(model, slots=slots, max_queue=max_queue, prefill_chunk=prefill_chunk,
                                       window=lambda: window, deliver=self._deliver, metrics=metrics,
                                       model_name="m", prefill_in_step=prefill_in_step)

    def _deliver(self, batch) -> None:
        with self.lock:
            for job, event in batch:
                self.events.setdefault(job, []).append(event)

    def job(self, prompt: list[int], max_tokens: int, stops=(), sampling=SamplingConfig()) -> Job:
        return new_job(self.model.layout, prompt, max_tokens=max_tokens, sampling=sampling, stops=tuple(stops))

    def text(self, job: Job) -> str:
        return "".join(e.text for e in self.events.get(job, []))

    def wait(self, jobs, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if all(self.events.get(j) and self.events[j][-1].finish_reason for j in jobs):
                    return
            time.sleep(0.005)
        raise AssertionError(f"jobs did not finish: {[j.finish_reason for j in jobs]}")

    def __enter__(self) -> "Served":
        self.scheduler.start()
        return self

    def __exit__(self, *exc) -> None:
        self.scheduler.close()


# --- stop strings -----------------------------------------------------------------------------------------------
HELLO = {1: "Hello", 2: " EN", 3: "D", 4: "!"}
HELLO_SCRIPT = {5: 1, 1: 2, 2: 3, 3: 4, 4: 4}


def test_a_stop_string_split_across_tokens_is_never_returned():
    """Pieces "Hello", " EN", "D" with stop "END": 'Hello ' from both the Generator and the scheduler, and no
    chunk ever carries part of the stop string."""
    model = ScriptedDecoder(HELLO, HELLO_SCRIPT)
    config = GenerationConfig(max_tokens=10, stop=("END",))
    result = Generator(model).generate([5], config)
    chunks = [c.text for c in Generator(model).stream([5], config)]
    assert (result.text, result.tokens, result.finish_reason) == ("Hello ", [1, 2, 3], "stop")
    assert chunks == ["Hello", " "]
    with Served(ScriptedDecoder(HELLO, HELLO_SCRIPT)) as served:
        job = served.job([5], 10, ("END",))
        served.scheduler.submit(job)
        served.wait([job])
    assert (served.text(job), job.tokens, job.finish_reason) == ("Hello ", [1, 2, 3], "stop")


def test_text_held_for_a_stop_string_is_returned_when_the_text_ends():
    """" EN" waits for a possible "D"; end of text (or the length limit) instead releases it."""
    model = ScriptedDecoder(HELLO, {5: 1, 1: 2, 2: EOS})
    for config, reason in ((GenerationConfig(max_tokens=10, stop=("END",)), "stop"),
                           (GenerationConfig(max_tokens=2, stop=("END",)), "length")):
        result = Generator(model).generate([5], config)
        assert (result.text, result.finish_reason) == ("Hello EN", reason)


def _reference_stops(pieces: list[str], stops: tuple[str, ...]) -> tuple[str, bool]:
    """The text a client sees, the plain way: after each piece, search the whole text so far; at the first piece
    that completes a stop string, cut where the earliest one begins."""
    text = ""
    for piece in pieces:
        text += piece
        hits = [i for i in (text.find(s) for s in stops) if i != -1]
        if hits:
            return text[:min(hits)], True
    return text, False


def test_stop_matcher_equals_a_search_of_the_whole_text():
    rng = random.Random(0)
    for trial in range(3000):
        alphabet = "ab" if trial % 2 else "abc"
        stops = tuple("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 3)))
        pieces = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4))) for _ in range(rng.randint(1, 8))]
        matcher, out, stopped = StopMatcher(stops), [], False
        for p in pieces:
            text, stopped = matcher.feed(p)
            out.append(text)
            assert not any(s in "".join(out) for s in stops)
            if stopped:
                break
        if not stopped:
            out.append(matcher.flush())
        want_text, want_stop = _reference_stops(pieces, stops)
        assert ("".join(out), stopped) == (want_text, want_stop), (stops, pieces)


class CountingStr(str):
    """A stop string that counts how often it is read (each index or slice), and refuses past a budget."""

    reads, budget = 0, 0

    def __getitem__(self, key):
        CountingStr.reads += 1
        if CountingStr.reads > CountingStr.budget:
            raise AssertionError(f"more than {CountingStr.budget} reads of the stop string")
        return str.__getitem__(self, key)


@pytest.mark.parametrize("stop, pieces, want", [
    # held all along, then released by a character that cannot continue it
    ("a" * 199_999 + "b", ["a" * 50] * 1000 + ["x"], ("a" * 50_000 + "x", False)),
    # a periodic stop string reached in 1,000 pieces after some text
    ("ab" * 100_000, ["xyz"] + ["ab" * 100] * 1000 + ["tail"], ("xyz", True)),
])
def test_stop_matching_work_is_linear_in_the_text_not_the_stop_string(stop, pieces, want):
    """A 200,000-character stop string over 1,000 pieces: the matcher reads the stop string a number of times
    bounded by a constant times the text fed (a check of every prefix of the stop string at every piece reads
    it ~200,000 times a piece)."""
    stop = CountingStr(stop)
    fed = sum(len(p) for p in pieces)
    CountingStr.reads, CountingStr.budget = 0, 8 * fed
    matcher, out, stopped = StopMatcher((stop,)), [], False
    for p in pieces:
        text, stopped = matcher.feed(p)
        out.append(text)
        if stopped:
            break
    assert ("".join(out), stopped) == want
    assert CountingStr.reads <= 8 * fed


# --- the scheduler's slots ----------------------------------------------------------------------------------------
def _metrics():
    prometheus_client = pytest.importorskip("prometheus_client")
    from edgeattn.runtime.server.metrics import GenerationMetrics

    registry = prometheus_client.CollectorRegistry()
    return GenerationMetrics(registry), registry


def test_a_job_ending_at_its_first_token_leaves_the_others_running():
    """A stream runs; a second request's first token is end of text: the stream goes on to its length, the
    second ends with no tokens, and the running gauge counts only the jobs still in a slot."""
    metrics, registry = _metrics()
    running = []
    served: Served

    def on_step(model, streams, ids):
        if model.calls == 4:  # the first job is decoding: the second arrives
            served.scheduler.submit(second)
        if second.finish_reason is not None and first.finish_reason is None:
            running.append(registry.get_sample_value("edgeattn_requests_running", {"model": "m"}))

    served = Served(ScriptedDecoder(on_step=on_step), metrics=metrics)
    first, second = served.job([3, 4], 30), served.job([7, 15], 10)
    with served:
        served.scheduler.submit(first)
        served.wait([first, second])
    assert (first.finish_reason, len(first.tokens)) == ("length", 30)
    assert (second.finish_reason, second.tokens) == ("stop", [])
    assert running and set(running) == {1.0}
    assert registry.get_sample_value("edgeattn_requests_running", {"model": "m"}) == 0
    assert registry.get_sample_value("edgeattn_request_success_total", {"model": "m", "finished_reason": "stop"}) == 1
    assert first.tokens == Generator(ScriptedDecoder()).generate([3, 4], GenerationConfig(max_tokens=30)).tokens


def test_every_free_slot_is_taken_at_once():
    """--slots 8 --max-queue 4: with one job in a slot, 11 more are accepted (7 free slots + 4 queued) and the
    next is refused; the next step holds all 8 slots (no prompt waits for another's prefill to be admitted)."""
    entered, gate, busy = threading.Event(), threading.Event(), []
    served: Served

    def on_step(model, streams, ids):
        busy.append(served.scheduler.busy)
        if model.calls == 1:
            entered.set()
            assert gate.wait(30)

    served = Served(ScriptedDecoder(on_step=on_step), slots=8, max_queue=4)
    prompts = [[1 + i % 13, 2 + i % 11, 3] for i in range(12)]
    jobs = [served.job(p, 6 + i) for i, p in enumerate(prompts)]
    with served:
        served.scheduler.submit(jobs[0])
        assert entered.wait(30)
        try:
            for job in jobs[1:]:
                served.scheduler.submit(job)
            with pytest.raises(QueueFull):
                served.scheduler.submit(served.job([1, 2], 4))
        finally:
            gate.set()
        served.wait(jobs)
    assert busy[:3] == [1, 1, 8]  # job 1's prefill and decode step; the next step holds every slot
    for job, prompt in zip(jobs, prompts):
        want = Generator(ScriptedDecoder()).generate(prompt, GenerationConfig(max_tokens=job.max_tokens,
                                                                              prefill_chunk=8))
        assert job.tokens == want.tokens and job.finish_reason == want.finish_reason


def test_a_request_cancelled_while_queued_never_runs():
    entered, gate, chunks = threading.Event(), threading.Event(), []

    def on_step(model, streams, ids):
        chunks.append(ids[0].tolist())
        if model.calls == 1:
            entered.set()
            assert gate.wait(30)

    served = Served(ScriptedDecoder(on_step=on_step), slots=1)
    first, queued = served.job([3, 4], 5), served.job([9, 9, 9], 5)
    with served:
        served.scheduler.submit(first)
        assert entered.wait(30)
        served.scheduler.submit(queued)
        queued.cancel()
        gate.set()
        served.wait([first, queued])
    assert (queued.finish_reason, queued.tokens) == ("abort", []) and [9, 9, 9] not in chunks
    assert (first.finish_reason, len(first.tokens)) == ("length", 5)


@pytest.mark.parametrize("prefill_in_step", [0, 4])
def test_slots_moved_and_swapped_keep_each_jobs_rows(prefill_in_step):
    """Many jobs of different lengths through 3 slots (long prompts prefilled in chunks of 3 beside short ones
    prefilled in steps): every job's tokens equal its tokens alone, which read the stream's own first row."""
    rng = random.Random(1)
    prompts = [[rng.randint(1, 14) for _ in range(rng.choice([2, 3, 9, 17]))] for _ in range(14)]
    with Served(ScriptedDecoder(window_max=24), slots=3, max_queue=20, prefill_chunk=3,
                prefill_in_step=prefill_in_step) as served:
        jobs = [served.job(p, rng.randint(1, 12)) for p in prompts]
        for job in jobs:
            served.scheduler.submit(job)
        served.wait(jobs)
    assert served.scheduler.moves > 0
    for job, prompt in zip(jobs, prompts):
        want = Generator(ScriptedDecoder(window_max=24)).generate(
            prompt, GenerationConfig(max_tokens=job.max_tokens, prefill_chunk=3))
        assert job.tokens == want.tokens, prompt


def test_a_backend_that_samples_on_its_device():
    """A backend offering step_sample is asked for token ids, not logits, and gives the same stream."""
    model = DeviceSampler(HELLO, HELLO_SCRIPT)
    result = Generator(model).generate([5], GenerationConfig(max_tokens=10, stop=("END",)))
    assert result.text == "Hello " and model.sampled_calls == 3
    want = Generator(ScriptedDecoder()).generate([3, 9, 4], GenerationConfig(max_tokens=12, prefill_chunk=2))
    got = Generator(DeviceSampler()).generate([3, 9, 4], GenerationConfig(max_tokens=12, prefill_chunk=2))
    assert got.tokens == want.tokens


def test_a_model_failure_ends_only_the_jobs_of_that_call():
    """A prefill chunk that fails ends its own job (the Generator raises it); the other jobs go on."""
    def on_step(model, streams, ids):
        if 13 in ids[:, 0].tolist() and ids.shape[1] > 1:
            raise RuntimeError("bad chunk")

    with Served(ScriptedDecoder(on_step=on_step)) as served:
        good, bad = served.job([3, 4], 12), served.job([13, 4, 5], 12)
        served.scheduler.submit(good)
        served.scheduler.submit(bad)
        served.wait([good, bad])
    assert bad.finish_reason == "error: RuntimeError: bad chunk" and isinstance(bad.error, RuntimeError)
    assert (good.finish_reason, len(good.tokens)) == ("length", 12)
    with pytest.raises(RuntimeError, match="bad chunk"):
        Generator(ScriptedDecoder(on_step=on_step)).generate([13, 4, 5])


def test_a_prompt_longer_than_the_cache_keeps_head_and_tail():
    layout = RingLayout(2, 8)
    job = new_job(layout, list(range(1, 31)), max_tokens=2, sampling=SamplingConfig())
    assert job.prompt == [1, 2] + list(range(25, 31)) and job.evicted == 22 and job.prompt_tokens == 30  # 10 - 2 kept


@requires_decoder_stack
def test_the_backends_satisfy_the_protocol(tiny_decoder):
    from edgeattn.runtime.generation.backend import DecoderBackend, SamplingBackend
    from edgeattn.runtime.generation.torch_decoder import TorchDecoderModel

    model, tok, _, path = tiny_decoder
    with Generator.open(path) as gen:
        assert isinstance(gen.model, DecoderBackend) and not isinstance(gen.model, SamplingBackend)
    assert isinstance(TorchDecoderModel(model, tok, sinks=4, window_max=48, cuda_graphs=False), DecoderBackend)
    assert isinstance(ScriptedDecoder(), DecoderBackend) and isinstance(DeviceSampler(), SamplingBackend)
    assert not isinstance(object(), DecoderBackend)


# --- a real model: the Generator and the scheduler at several windows --------------------------------------------
PROMPTS = ["The window shrinks as the device heats up, and", "Once upon a time", "def fibonacci(n):"]
SAMPLING = SamplingConfig(temperature=0.7, seed=5)


def _same_tokens(path, window: int, max_tokens: int, prompts=PROMPTS, slots: int = 2) -> None:
    """The prompts at once through `slots` slots (the others queued), plus the last one again with a stop string
    taken from its own text, and each alone through the Generator: the same tokens, text and finish."""
    with Generator.open(path) as gen:
        ids = [gen.prompt_ids(p) for p in prompts]
        config = GenerationConfig(max_tokens=max_tokens, prefill_chunk=16, window=window, sampling=SAMPLING)
        refs = [gen.generate(i, config) for i in ids]
        capacity = gen.model.layout.capacity
        assert all(len(r.tokens) == max_tokens and len(i) + max_tokens > capacity for i, r in zip(ids, refs))
        text = refs[-1].text
        stop = text[len(text) // 2:][:4]
        stopped = gen.generate(ids[-1], GenerationConfig(max_tokens=max_tokens, prefill_chunk=16, window=window,
                                                         sampling=SAMPLING, stop=(stop,)))
        assert stopped.finish_reason == "stop" and stopped.text == text[:text.find(stop)]
        with Served(gen.model, slots=slots, prefill_chunk=16, window=window) as served:
            jobs = [served.job(i, max_tokens, sampling=SAMPLING) for i in ids]
            jobs.append(served.job(ids[-1], max_tokens, (stop,), SAMPLING))
            for job in jobs:
                served.scheduler.submit(job)
            served.wait(jobs, timeout=300)
    for job, ref in zip(jobs, refs + [stopped]):
        assert job.tokens == ref.tokens and served.text(job) == ref.text and job.finish_reason == ref.finish_reason


@requires_decoder_stack
def test_generator_and_scheduler_agree_past_the_end_of_the_ring(tiny_decoder):
    """Window 8 on the ring of 48 (+ 4 sinks), 60 positions and more."""
    _same_tokens(tiny_decoder[3], 8, 50, PROMPTS[1:])


RING = 72


@pytest.fixture(scope="module")
def ring_bundle(tmp_path_factory):
    from decoder_fixtures import tiny_llama
    from edgeattn.bundle.build import BuildConfig, build
    from edgeattn.decoder.export import DecoderExportConfig, export_decoder_model

    model, tok = tiny_llama()
    folder = tmp_path_factory.mktemp("engine")
    onnx_path = export_decoder_model(model, tok, folder / "ring.onnx", DecoderExportConfig(sinks=4, window_max=RING))
    bundle = build(onnx_path, BuildConfig(target="cpu", seq=(1, 1, 16), dims=(("cache", (8, 4 + RING, 4 + RING)),)))
    return bundle.path


@pytest.mark.slow
@requires_decoder_stack
@pytest.mark.parametrize("window", [0, 8, 64])
def test_generator_and_scheduler_give_the_same_tokens(ring_bundle, window):
    """A ring of 72 (+ 4 sinks): windows 0, 8 and 64, for 90 positions and more (the ring wraps)."""
    _same_tokens(ring_bundle, window, 80)
