"""The generation service: OpenAI-compatible and Triton generate routes on a real server (loopback, real HTTP),
continuous batching over slots, cancellation, back-pressure, the live window, metrics and bad input.

The tiny decoder (random weights, SmolLM2's tokenizer) keeps it fast; references are the same requests
served alone, and the Generator run directly on the bundle."""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("aiohttp")

from decoder_fixtures import requires_decoder_stack  # noqa: E402
from serve_support import (JSON, http, metric_value, next_event, open_stream, post_json, sse,  # noqa: E402
                           tiny_bundle, wait_ready_http)

pytestmark = requires_decoder_stack
PROMPTS = ["The capital of France", "Once upon a time", "def fibonacci(n):", "Heat flows from", "1, 2, 3,",
           "A haiku about rain", "Hello there", "Matrix multiplication", "The sinks keep"]


def _server(bundles, names, **settings):
    from edgeattn.runtime.server.app import create_app
    from edgeattn.runtime.server.runner import BackgroundServer
    from edgeattn.runtime.server.settings import ServeSettings

    base = dict(port=0, warmup_runs=0, max_queue_delay_ms=0, prefill_chunk=16)
    app = create_app(bundles, ServeSettings(**{**base, **settings}), names=names, sensors=False)
    return app, BackgroundServer(app)


@pytest.fixture(scope="module")
def served(tiny_decoder, tmp_path_factory):
    """A server holding the tiny decoder ("dec") and a tiny encoder ("enc"): (url, app)."""
    from edgeattn.bundle.folder import open_bundle

    enc = tiny_bundle(tmp_path_factory.mktemp("enc"))
    app, server = _server([open_bundle(tiny_decoder[3]), enc], ["dec", "enc"], slots=8)
    with server as url:
        wait_ready_http(url)
        yield url, app


def _complete(url, prompt, **kw):
    status, doc, _ = post_json(url, "/v1/completions", {"model": "dec", "prompt": prompt, "temperature": 0, **kw})
    assert status == 200, doc
    return doc


def _reference(path, prompt, max_tokens, window=0):
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    with Generator.open(path) as g:
        return g.generate(prompt, GenerationConfig(max_tokens=max_tokens, prefill_chunk=16, window=window))


def test_models_and_both_kinds_served(served):
    url, _ = served
    status, doc, _ = http(url, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in doc["data"]] == ["dec"] and doc["object"] == "list"
    status, doc, _ = http(url, "GET", "/v2/models/dec")
    assert status == 200 and doc["parameters"]["slots"] == 8
    body = json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 4], "data": [1, 2, 3, 4]},
                                  {"name": "attention_mask", "datatype": "INT64", "shape": [1, 4],
                                   "data": [1, 1, 1, 1]}]}).encode()
    status, doc, _ = http(url, "POST", "/v2/models/enc/infer", body, JSON)
    assert status == 200, doc  # the encoder keeps KServe v2
    status, doc, _ = http(url, "POST", "/v2/models/dec/infer", body, JSON)
    assert status == 400 and "generate" in doc["error"]


def test_completion_equals_the_generator(served, tiny_decoder):
    url, _ = served
    doc = _complete(url, PROMPTS[0], max_tokens=12)
    ref = _reference(tiny_decoder[3], PROMPTS[0], 12)
    choice = doc["choices"][0]
    assert doc["object"] == "text_completion" and choice["text"] == ref.text
    assert choice["finish_reason"] == ref.finish_reason
    assert doc["usage"] == {"prompt_tokens": ref.prompt_tokens, "completion_tokens": len(ref.tokens),
                            "total_tokens": ref.prompt_tokens + len(ref.tokens), "evicted_prompt_tokens": 0}
    assert doc["parameters"]["attention_window"] == 0


def test_streamed_completion_is_sse_and_joins_to_the_whole(served):
    url, _ = served
    whole = _complete(url, PROMPTS[1], max_tokens=10)
    status, events, raw = sse(url, "/v1/completions", {"model": "dec", "prompt": PROMPTS[1], "temperature": 0,
                                                       "max_tokens": 10, "stream": True,
                                                       "stream_options": {"include_usage": True}})
    assert status == 200 and raw.endswith("data: [DONE]\n\n")
    assert all(block.startswith("data: ") for block in raw.strip().split("\n\n"))
    assert events[-1] == "[DONE]"
    usage, chunks = events[-2], events[:-2]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == whole["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert all(c["id"] == chunks[0]["id"] and c["parameters"]["attention_window"] == 0 for c in chunks)


def test_chat_streaming_and_not(served):
    url, _ = served
    body = {"model": "dec", "messages": [{"role": "user", "content": "Hi there"}], "temperature": 0, "max_tokens": 9}
    status, doc, _ = post_json(url, "/v1/chat/completions", body)
    assert status == 200 and doc["object"] == "chat.completion"
    message = doc["choices"][0]["message"]
    assert message["role"] == "assistant" and doc["usage"]["completion_tokens"] >= 1
    status, events, _ = sse(url, "/v1/chat/completions", {**body, "stream": True})
    assert status == 200 and events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == message["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == doc["choices"][0]["finish_reason"]


def test_stop_strings_end_the_text(served):
    url, _ = served
    text = _complete(url, PROMPTS[2], max_tokens=24)["choices"][0]["text"]
    stop = text[len(text) // 2:len(text) // 2 + 3]
    cut = text[:text.find(stop)]
    for kw in ({"stop": stop}, {"stop": ["zzzzqqq", stop]}):
        doc = _complete(url, PROMPTS[2], max_tokens=24, **kw)
        assert doc["choices"][0]["text"] == cut and doc["choices"][0]["finish_reason"] == "stop"
        status, events, _ = sse(url, "/v1/completions", {"model": "dec", "prompt": PROMPTS[2], "temperature": 0,
                                                         "max_tokens": 24, "stream": True, **kw})
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) == cut


def test_seed_reproduces_sampling(served):
    url, _ = served
    kw = dict(max_tokens=16, temperature=1.0, top_p=0.95)
    a = _complete(url, PROMPTS[3], seed=7, **kw)["choices"][0]["text"]
    b = _complete(url, PROMPTS[3], seed=7, **kw)["choices"][0]["text"]
    c = _complete(url, PROMPTS[3], seed=8, **kw)["choices"][0]["text"]
    assert a == b and a != c


def test_each_request_equals_itself_served_alone_while_eight_others_run(served):
    url, app = served
    from edgeattn.runtime.server.generate_routes import DECODERS

    alone = {p: _complete(url, p, max_tokens=20 + i)["choices"][0]["text"] for i, p in enumerate(PROMPTS)}
    moves = app[DECODERS]["dec"].scheduler.moves
    together: dict[str, str] = {}

    def one(i, p):
        together[p] = _complete(url, p, max_tokens=20 + i)["choices"][0]["text"]

    threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(PROMPTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert together == alone
    assert app[DECODERS]["dec"].scheduler.moves > moves  # slots were compacted while others ran


def test_triton_generate_and_generate_stream(served):
    url, _ = served
    whole = _complete(url, PROMPTS[4], max_tokens=8)["choices"][0]["text"]
    status, doc, _ = post_json(url, "/v2/models/dec/generate", {"text_input": PROMPTS[4],
                                                                  "parameters": {"max_tokens": 8}})
    assert status == 200 and doc["text_output"] == whole and doc["model_name"] == "dec"
    assert doc["parameters"]["attention_window"] == 0 and doc["usage"]["completion_tokens"] >= 1
    status, events, _ = sse(url, "/v2/models/dec/generate_stream", {"text_input": PROMPTS[4], "max_tokens": 8})
    assert status == 200 and "".join(e["text_output"] for e in events) == whole
    assert events[-1]["finish_reason"] in ("stop", "length")
    status, doc, _ = post_json(url, "/v2/models/nope/generate", {"text_input": "x"})
    assert status == 404 and isinstance(doc["error"], str)


def _metrics(url) -> str:
    import http.client

    host, port = url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return text


def test_a_client_that_disconnects_frees_its_slot(served):
    url, _ = served
    conn, response = open_stream(url, "/v1/completions", {"model": "dec", "prompt": PROMPTS[5], "temperature": 0,
                                                          "max_tokens": 500, "stream": True})
    assert next_event(response)["choices"][0]["text"] is not None
    before = metric_value(_metrics(url), "edgeattn_request_success_total", 'finished_reason="abort",model="dec"') or 0
    conn.sock.close()
    conn.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = _metrics(url)
        if metric_value(text, "edgeattn_requests_running", 'model="dec"') == 0:
            break
        time.sleep(0.05)
    assert metric_value(text, "edgeattn_requests_running", 'model="dec"') == 0
    after = metric_value(text, "edgeattn_request_success_total", 'finished_reason="abort",model="dec"')
    assert after == before + 1  # ended early, not after its 500 tokens
    assert _complete(url, PROMPTS[5], max_tokens=4)["usage"]["completion_tokens"] >= 1


def test_the_window_changes_in_flight_streams(served):
    url, app = served
    conn, response = open_stream(url, "/v1/completions", {"model": "dec", "prompt": PROMPTS[6], "temperature": 0,
                                                          "max_tokens": 500, "stream": True})
    try:
        first = next_event(response)
        assert first["parameters"]["attention_window"] == 0
        status, doc, _ = post_json(url, "/v2/admin/window", {"window": 8, "reason": "test"})
        assert status == 200, doc
        windows = []
        while (event := next_event(response)) not in (None, "[DONE]"):
            windows.append(event["parameters"]["attention_window"])
    finally:
        conn.close()
        post_json(url, "/v2/admin/window", {"window": 0})
    assert windows[-1] == 8 and 8 in windows
    assert windows == sorted(windows, key=lambda w: w == 8)  # 0 until the change, 8 from then on


def test_metrics_are_exported(served):
    url, _ = served
    _complete(url, PROMPTS[7], max_tokens=4)
    text = _metrics(url)
    for name in ("edgeattn_time_to_first_token_seconds_count", "edgeattn_inter_token_latency_seconds_count",
                 "edgeattn_prompt_tokens_total", "edgeattn_generation_tokens_total",
                 "edgeattn_request_success_total", "edgeattn_requests_running", "edgeattn_requests_waiting",
                 "edgeattn_kv_cache_tokens", "edgeattn_kv_cache_evicted_tokens_total", "edgeattn_attention_window",
                 "edgeattn_slots"):
        assert name in text, name
    assert metric_value(text, "edgeattn_generation_tokens_total", 'model="dec"') >= 4
    assert metric_value(text, "edgeattn_slots", 'model="dec"') == 8


BAD = [
    ({"model": "nope", "prompt": "x"}, 404, "model"),
    ({"model": 3, "prompt": "x"}, 400, "model"),
    ({"model": "dec", "prompt": 5}, 400, "prompt"),
    ({"model": "dec", "prompt": ""}, 400, "prompt"),
    ({"model": "dec", "prompt": ["a", "b"]}, 400, "prompt"),
    ({"model": "dec", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "dec", "prompt": "x", "max_tokens": 10**6}, 400, "max_tokens"),
    ({"model": "dec", "prompt": "x", "max_tokens": "8"}, 400, "max_tokens"),
    ({"model": "dec", "prompt": "x", "n": 2}, 400, "n"),
    ({"model": "dec", "prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"model": "dec", "prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"model": "dec", "prompt": "x", "stop": 3}, 400, "stop"),
    ({"model": "dec", "prompt": "x", "seed": -1}, 400, "seed"),
    ({"model": "dec", "prompt": "x", "stream": "yes"}, 400, "stream"),
    ({"model": "dec", "prompt": [1, 10**9]}, 400, "prompt"),
]


@pytest.mark.parametrize("body,status,param", BAD)
def test_bad_completion_requests_get_openai_errors(served, body, status, param):
    url, _ = served
    got, doc, _ = post_json(url, "/v1/completions", body)
    assert got == status, doc
    assert set(doc["error"]) == {"message", "type", "param", "code"} and doc["error"]["param"] == param


def test_bad_bodies_and_chat_messages(served):
    url, _ = served
    for raw in (b"{not json", b'{"model": "dec", "prompt": "\xff\xfe"}', b"[1, 2]"):
        status, doc, _ = http(url, "POST", "/v1/completions", raw, JSON)
        assert status == 400 and "message" in doc["error"], (raw, doc)
    for messages, param in (([], "messages"), (None, "messages"), ([{"role": "user"}], "messages[0].content")):
        status, doc, _ = post_json(url, "/v1/chat/completions", {"model": "dec", "messages": messages})
        assert status == 400 and doc["error"]["param"] == param, doc
    assert _complete(url, PROMPTS[8], max_tokens=3)["usage"]["completion_tokens"] >= 1  # still serving


def test_a_prompt_longer_than_the_cache_keeps_head_and_tail(served, tiny_decoder):
    url, _ = served
    prompt = " ".join(f"word{i}" for i in range(200))
    doc = _complete(url, prompt, max_tokens=6)
    ref = _reference(tiny_decoder[3], prompt, 6)
    assert doc["usage"]["evicted_prompt_tokens"] == ref.evicted_prompt_tokens > 0
    assert doc["choices"][0]["text"] == ref.text


def test_a_full_queue_answers_429_with_retry_after(tiny_decoder):
    from edgeattn.bundle.folder import open_bundle

    _, server = _server([open_bundle(tiny_decoder[3])], ["dec"], slots=1, max_queue=1)
    with server as url:
        wait_ready_http(url)
        # sampled, not greedy: the tiny random model's greedy stream can reach end-of-text within a few tokens,
        # which would free the slot before the third request arrives
        body = {"model": "dec", "prompt": PROMPTS[0], "temperature": 1.0, "seed": 1, "max_tokens": 500, "stream": True}
        running, r1 = open_stream(url, "/v1/completions", body)
        queued, r2 = open_stream(url, "/v1/completions", body)
        try:
            assert next_event(r1) is not None
            status, doc, headers = post_json(url, "/v1/completions", body)
            assert status == 429 and headers.get("Retry-After") == "1" and doc["error"]["code"] == "queue_full"
        finally:
            running.close()
            queued.close()


def test_a_burst_fills_every_free_slot_before_the_queue(tiny_decoder):
    """--slots 8 --max-queue 4 and 12 requests at once: all are served (8 take slots at once, 4 wait), none
    gets 429 while a slot is free."""
    from edgeattn.bundle.folder import open_bundle

    _, server = _server([open_bundle(tiny_decoder[3])], ["dec"], slots=8, max_queue=4)
    with server as url:
        wait_ready_http(url)
        statuses: list[int] = []

        def one(i):
            status, _, _ = post_json(url, "/v1/completions", {"model": "dec", "prompt": PROMPTS[i % len(PROMPTS)],
                                                              "temperature": 0, "max_tokens": 6})
            statuses.append(status)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert statuses == [200] * 12


class _FakeController:
    """A thermal controller that reports a fixed temperature (the window is set by the test)."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def metrics_snapshot(self) -> dict:
        return {"temp_c": 71.5, "throttle": 0}


def test_chunks_carry_the_device_temperature(tiny_decoder):
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.server.app import create_app
    from edgeattn.runtime.server.runner import BackgroundServer
    from edgeattn.runtime.server.settings import ServeSettings

    app = create_app([open_bundle(tiny_decoder[3])], ServeSettings(port=0, warmup_runs=0, window=16), names=["dec"],
                     controller=_FakeController(), sensors=False)
    with BackgroundServer(app) as url:
        wait_ready_http(url)
        status, events, _ = sse(url, "/v1/chat/completions", {"model": "dec", "max_tokens": 5, "stream": True,
                                                               "messages": [{"role": "user", "content": "Hi"}]})
        status2, doc, _ = post_json(url, "/v2/models/dec/generate", {"text_input": "Hi", "max_tokens": 3})
    assert status == 200 and status2 == 200
    for params in [e["parameters"] for e in events[1:-1]] + [doc["parameters"]]:
        assert params == {"attention_window": 16, "attention_budget": 20, "device_temp_c": 71.5, "device_throttle": 0}


def test_prompts_prefilled_inside_the_decode_steps_give_the_same_tokens(tiny_decoder):
    """--prefill-in-step: short prompts ride along the decode steps (one token per step) while a long one is
    prefilled in chunks; every answer equals the Generator's (chunked prefill, alone)."""
    from edgeattn.bundle.folder import open_bundle

    path = tiny_decoder[3]
    long_prompt = " ".join(f"w{i}" for i in range(40))  # > 24 tokens: chunked
    prompts = PROMPTS[:6] + [long_prompt]
    refs = {p: _reference(path, p, 10).text for p in prompts}
    app, server = _server([open_bundle(path)], ["dec"], slots=4, prefill_in_step=24)
    with server as url:
        wait_ready_http(url)
        got: dict[str, str] = {}

        def one(p):
            got[p] = _complete(url, p, max_tokens=10)["choices"][0]["text"]

        threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert got == refs


def _profile(url):
    status, doc, _ = http(url, "GET", "/v2/models/dec/stats")
    assert status == 200
    return doc["model_stats"][0]["profile"]


def test_stats_profile_counts_the_model_calls_of_a_request(served):
    """One request alone: one prefill chunk (its prompt fits one), then one decode step per further token; the
    profile's totals count exactly those calls, and its phases fit in the time the request took."""
    url, _ = served
    before = _profile(url)
    started = time.perf_counter()
    doc = _complete(url, PROMPTS[1], max_tokens=9)
    elapsed = time.perf_counter() - started
    after = _profile(url)
    tokens, finish = doc["usage"]["completion_tokens"], doc["choices"][0]["finish_reason"]
    steps = tokens - 1 if finish == "length" else tokens  # an end-of-text token is sampled but not counted
    calls = {k: after["counts"][k] - before["counts"][k] for k in ("prefill_model", "decode_model", "sample")}
    assert calls == {"prefill_model": 1, "decode_model": steps, "sample": steps + 1}
    assert after["iterations"] - before["iterations"] == max(steps, 1)
    model_s = sum(after["seconds"][k] - before["seconds"][k] for k in ("prefill_model", "decode_model"))
    assert 0 < model_s < elapsed
    new = [r for r in after["recent"] if r[0] > before["iterations"]]
    assert [r[2] for r in new] == [doc["usage"]["prompt_tokens"]] + [0] * (len(new) - 1)  # the chunk, then none
    assert all(r[1] == 1 and r[3] >= r[4] + r[5] for r in new)  # one row; the iteration holds its model calls


def test_a_smaller_ring_than_the_bundles(tiny_decoder):
    """window_max: the server's slots hold fewer ring rows than the bundle's; a stream longer than the ring
    wraps it and equals the Generator opened with the same ring."""
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator

    path, ring, prompt = tiny_decoder[3], 20, PROMPTS[4]
    with Generator.open(path, window_max=ring) as g:
        ref = g.generate(prompt, GenerationConfig(max_tokens=30, prefill_chunk=16))
    app, server = _server([open_bundle(path)], ["dec"], slots=2, window_max=ring)
    with server as url:
        wait_ready_http(url)
        status, meta, _ = http(url, "GET", "/v2/models/dec")
        doc = _complete(url, prompt, max_tokens=30)
    assert status == 200 and meta["parameters"]["window_max"] == ring
    assert doc["choices"][0]["text"] == ref.text and doc["usage"]["completion_tokens"] == len(ref.tokens)


def test_a_larger_ring_than_the_bundles_is_refused(tiny_decoder):
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.errors import ConfigError

    from decoder_fixtures import WINDOW_MAX

    with pytest.raises(ConfigError, match=f"window_max: expected at most 'dec''s ring of {WINDOW_MAX} rows, "
                                          f"found {WINDOW_MAX + 1}"):
        _server([open_bundle(tiny_decoder[3])], ["dec"], window_max=WINDOW_MAX + 1)


def test_window_max_setting_is_checked():
    from edgeattn.errors import ConfigError
    from edgeattn.runtime.server.settings import ServeSettings

    assert ServeSettings.from_env({"EDGEATTN_SERVE_WINDOW_MAX": "256"}).window_max == 256
    with pytest.raises(ConfigError, match="window_max: expected >= 0, found -1"):
        ServeSettings(window_max=-1)
