"""No request takes the server down: bounded generation bodies prepared off the event loop, stop-string bounds,
bodies that used to be 500s (lone surrogates, numbers of hundreds or thousands of digits, corrupt
Content-Encoding) answered 4xx on a connection that stays usable, versions and nulls on the generation
routes. A real server on 127.0.0.1, the tiny decoder and a tiny encoder."""

from __future__ import annotations

import gzip
import http.client as http_client
import json
import threading
import zlib

import pytest

pytest.importorskip("aiohttp")

from decoder_fixtures import requires_decoder_stack  # noqa: E402
from edgeattn.runtime.server.app import create_app  # noqa: E402
from edgeattn.runtime.server.runner import BackgroundServer  # noqa: E402
from edgeattn.runtime.server.settings import ServeSettings  # noqa: E402
from serve_support import JSON, http, post_json, sse, tiny_bundle, wait_ready_http  # noqa: E402

BOUND = 64 << 10  # the test server's max_generate_body_bytes
BIG = "1" + "0" * 4400  # more digits than Python converts from text (4300)
ROUTES = ["/v1/completions", "/v1/chat/completions", "/v2/models/dec/generate", "/v2/models/dec/generate_stream"]


def _start(bundles, names, **settings):
    base = dict(port=0, warmup_runs=0, max_queue_delay_ms=0, body_timeout_s=10, slots=2)
    app = create_app(bundles, ServeSettings(**{**base, **settings}), names=names, sensors=False)
    return app, BackgroundServer(app)


@pytest.fixture(scope="module")
def served(tiny_decoder, tmp_path_factory):
    """The tiny decoder ("dec") and a tiny encoder ("enc"), generation bodies bounded at 64 KiB: (url, app)."""
    from edgeattn.bundle.folder import open_bundle

    enc = tiny_bundle(tmp_path_factory.mktemp("enc"))
    app, server = _start([open_bundle(tiny_decoder[3]), enc], ["dec", "enc"], max_generate_body_bytes=BOUND,
                         max_stops=3, max_stop_chars=8)
    with server as url:
        wait_ready_http(url)
        yield url, app


def _body(route: str, text: str = "Hello there", **fields) -> dict:
    """A valid request for `route` with `text` as its prompt, message or text_input."""
    if route.startswith("/v1/chat"):
        return {"model": "dec", "messages": [{"role": "user", "content": text}], "max_tokens": 2, **fields}
    if route.startswith("/v1"):
        return {"model": "dec", "prompt": text, "max_tokens": 2, **fields}
    return {"text_input": text, "max_tokens": 2, **fields}


def _error(doc: dict) -> str:
    error = doc["error"]
    return error if isinstance(error, str) else error["message"]


def _then_health(url: str, method: str, path: str, body: bytes, headers: dict) -> tuple[int, dict, int]:
    """The request, then GET /v2/health/live on the same keep-alive connection: (status, JSON, next status)."""
    host, port = url.split(":")
    conn = http_client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        doc = json.loads(raw) if raw.startswith(b"{") else {"raw": raw[:200].decode(errors="replace")}
        conn.request("GET", "/v2/health/live")
        after = conn.getresponse()
        after.read()
        return response.status, doc, after.status
    finally:
        conn.close()


# --- 1. bounded bodies, prepared off the event loop -------------------------------------------------------
@pytest.mark.parametrize("route", ROUTES)
def test_a_body_over_the_generation_bound_is_413(served, route):
    url, _ = served
    body = json.dumps(_body(route, "word " * (BOUND // 4))).encode()
    assert len(body) > BOUND
    status, doc, after = _then_health(url, "POST", route, body, JSON)
    assert status == 413, doc
    assert f"at most {BOUND} bytes" in _error(doc) and after == 200


def test_a_chunked_or_compressed_body_over_the_bound_is_413(served):
    url, _ = served
    body = json.dumps(_body("/v1/completions", "word " * (BOUND // 4))).encode()
    host, port = url.split(":")
    conn = http_client.HTTPConnection(host, int(port), timeout=60)
    try:  # no Content-Length: counted as it arrives
        conn.request("POST", "/v1/completions", body=iter([body[i:i + 4096] for i in range(0, len(body), 4096)]),
                     headers=JSON, encode_chunked=True)
        response = conn.getresponse()
        assert response.status == 413, response.read()
    finally:
        conn.close()
    bomb = gzip.compress(body)  # small on the wire, over the bound once decoded
    assert len(bomb) < BOUND
    status, doc, after = _then_health(url, "POST", "/v1/completions", bomb, {**JSON, "Content-Encoding": "gzip"})
    assert status == 413 and "once decoded" in _error(doc) and after == 200, doc


def test_a_compressed_body_within_the_bound_is_answered(served):
    url, _ = served
    body = json.dumps(_body("/v1/completions", temperature=0)).encode()
    plain = post_json(url, "/v1/completions", json.loads(body))[1]["choices"][0]["text"]
    for coding, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body)),
                         ("deflate", zlib.compress(body)[2:-4]), ("identity", body)):
        status, doc, _ = http(url, "POST", "/v1/completions", data, {**JSON, "Content-Encoding": coding})
        assert status == 200 and doc["choices"][0]["text"] == plain, (coding, doc)


class _GatedTokenizer:
    """Wraps the decoder's tokenizer: encoding waits until `release` is set (and says when it started)."""

    def __init__(self, inner) -> None:
        self.inner, self.entered, self.release = inner, threading.Event(), threading.Event()

    def _wait(self) -> None:
        self.entered.set()
        self.release.wait(60)

    def encode(self, *args, **kwargs):
        self._wait()
        return self.inner.encode(*args, **kwargs)

    def encode_batch(self, *args, **kwargs):
        self._wait()
        return self.inner.encode_batch(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_health_answers_while_a_prompt_is_being_tokenized(served):
    """Tokenizing is held until the health check has been answered: it can be only if it runs off the loop."""
    from edgeattn.runtime.server.generate_routes import DECODERS

    url, app = served
    codec = app[DECODERS]["dec"].codec
    gate = _GatedTokenizer(codec.tokenizer)
    codec.tokenizer = gate
    result: dict = {}

    def complete() -> None:
        result["answer"] = post_json(url, "/v1/completions", _body("/v1/completions"), timeout=120)

    client = threading.Thread(target=complete)
    try:
        client.start()
        assert gate.entered.wait(60), "the request never reached the tokenizer"
        status, doc, _ = http(url, "GET", "/v2/health/live", timeout=30)  # a hang guard, not a measurement
        assert status == 200 and doc == {"live": True}
    finally:
        gate.release.set()
        client.join(120)
        codec.tokenizer = gate.inner
    assert result["answer"][0] == 200, result


# --- 2. stop strings --------------------------------------------------------------------------------------
@pytest.mark.parametrize("route", ["/v1/completions", "/v2/models/dec/generate"])
@pytest.mark.parametrize("stop, message", [(["a", "b", "c", "d"], "at most 3 strings, found 4"),
                                           ("123456789", "at most 8 characters, found one of 9"),
                                           (["ok", "x" * 1000], "at most 8 characters, found one of 1000")])
def test_stop_strings_beyond_the_bounds_are_400(served, route, stop, message):
    url, _ = served
    status, doc, _ = post_json(url, route, _body(route, stop=stop))
    assert status == 400 and message in _error(doc), doc
    if route.startswith("/v1"):
        assert doc["error"]["param"] == "stop"


def test_stop_strings_at_the_bounds_are_served(served):
    url, _ = served
    status, doc, _ = post_json(url, "/v1/completions", _body("/v1/completions", stop=["12345678", "a", "b"]))
    assert status == 200, doc


# --- 3. what used to be a 500 ---------------------------------------------------------------------------
def _raw(route: str, replace: dict[str, str], **fields) -> bytes:
    """A request body with placeholders replaced by raw JSON text (a lone surrogate escape, a long number)."""
    text = json.dumps(_body(route, "@TEXT@", **fields))
    for key, value in replace.items():
        text = text.replace(json.dumps(key), value)
    return text.encode()


LONE = '"ab \\ud800 c"'  # a lone surrogate escape in JSON text (6 characters)
SURROGATES = {
    "completion prompt": ("/v1/completions", _raw("/v1/completions", {"@TEXT@": LONE}), "prompt"),
    "prompt in a list": ("/v1/completions",
                         json.dumps({"model": "dec", "prompt": ["@"], "max_tokens": 2}).replace('"@"', LONE).encode(),
                         "prompt"),
    "chat content": ("/v1/chat/completions", _raw("/v1/chat/completions", {"@TEXT@": LONE}),
                     "messages[0].content"),
    "chat role": ("/v1/chat/completions",
                  json.dumps({"model": "dec", "messages": [{"role": "@R@", "content": "hi"}]}).replace('"@R@"', LONE)
                  .encode(), "messages[0].role"),
    "stop string": ("/v1/completions", _raw("/v1/completions", {"@STOP@": LONE}, stop="@STOP@"), "stop"),
    "triton text_input": ("/v2/models/dec/generate", _raw("/v2/models/dec/generate", {"@TEXT@": LONE}),
                          "text_input"),
}


@pytest.mark.parametrize("what", sorted(SURROGATES))
def test_a_lone_surrogate_is_400_naming_the_field(served, what):
    url, _ = served
    route, body, field = SURROGATES[what]
    status, doc, after = _then_health(url, "POST", route, body, JSON)
    assert status == 400 and after == 200, doc
    assert f"{field}: expected valid Unicode text, found a lone surrogate" in _error(doc), doc


HUGE = {
    "temperature of 400 digits": ("/v1/completions", _raw("/v1/completions", {"@T@": "1" + "0" * 400},
                                                         temperature="@T@"), "temperature: expected a number in"),
    "top_p of 400 digits": ("/v2/models/dec/generate", _raw("/v2/models/dec/generate", {"@T@": "-" + "9" * 400},
                                                           top_p="@T@"), "top_p: expected a number in"),
    "max_tokens of 4400 digits": ("/v1/completions", _raw("/v1/completions", {"@N@": BIG}, max_tokens="@N@"),
                                  "at most 4300 digits"),
    "seed of 4400 digits on generate": ("/v2/models/dec/generate",
                                        _raw("/v2/models/dec/generate", {"@N@": BIG}, seed="@N@"),
                                        "at most 4300 digits"),
    "chat max_tokens of 4000 digits": ("/v1/chat/completions",
                                       _raw("/v1/chat/completions", {"@N@": "9" * 4000}, max_tokens="@N@"),
                                       "max_tokens: expected 1..512"),
    "KServe data of 4400 digits": ("/v2/models/enc/infer", json.dumps({"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": ["@N@"]}]}).replace('"@N@"', BIG)
        .encode(), "at most 4300 digits"),
    "KServe shape of 12000 digits": ("/v2/models/enc/infer", json.dumps({"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": ["@N@", "@N@", "@N@"], "data": [1]}]})
        .replace('"@N@"', "9" * 4000).encode(), "more than 2147483648 elements"),
    "admin window of 4400 digits": ("/v2/admin/window", b'{"window": ' + BIG.encode() + b"}",
                                    "at most 4300 digits"),
}


@pytest.mark.parametrize("what", sorted(HUGE))
def test_numbers_of_thousands_of_digits_are_400(served, what):
    url, _ = served
    route, body, phrase = HUGE[what]
    status, doc, after = _then_health(url, "POST", route, body, JSON)
    assert status == 400 and after == 200, (what, doc)
    assert phrase in _error(doc) and "internal error" not in _error(doc), (what, doc)


POSTS = ROUTES + ["/v2/models/enc/infer", "/v2/admin/window", "/v2/admin/window/lock", "/v2/admin/window/unlock"]


@pytest.mark.parametrize("route", POSTS)
@pytest.mark.parametrize("coding, body, status, phrase", [
    ("gzip", b"this is not gzip at all", 400, "expected gzip data"),
    ("deflate", b"\x00\x01 nor deflate", 400, "expected deflate data"),
    ("gzip", gzip.compress(b'{"window": 3}', mtime=0)[:-6], 400, "cut short"),
    ("br", b"whatever", 415, "Content-Encoding: expected gzip"),
])
def test_a_corrupt_content_encoding_is_4xx_and_the_connection_goes_on(served, route, coding, body, status, phrase):
    url, _ = served
    got, doc, after = _then_health(url, "POST", route, body, {**JSON, "Content-Encoding": coding})
    assert got == status and phrase in _error(doc), (route, got, doc)
    assert after == 200, "the next request on the same connection was not answered"


# --- 6. versions, nulls, names ----------------------------------------------------------------------------
@pytest.mark.parametrize("route", ["/v2/models/dec/versions/2/generate", "/v2/models/dec/versions/x/generate_stream"])
def test_generate_refuses_an_unknown_version(served, route):
    url, _ = served
    status, doc, _ = post_json(url, route, _body(route))
    assert status == 404 and "has no version" in doc["error"] and "expected 1" in doc["error"], doc


def test_generate_takes_version_1(served):
    url, _ = served
    status, doc, _ = post_json(url, "/v2/models/dec/versions/1/generate", _body("/v2/models/dec/generate"))
    assert status == 200 and doc["model_version"] == "1", doc


@pytest.mark.parametrize("field", ["n", "best_of", "max_tokens", "temperature", "top_p", "seed", "stop", "stream"])
def test_null_is_the_default(served, field):
    url, _ = served
    status, doc, _ = post_json(url, "/v1/completions", {"model": "dec", "prompt": "Hi", "max_tokens": 2,
                                                        **{field: None}})
    assert status == 200, (field, doc)


def test_usage_says_evicted_prompt_tokens_as_the_library_does(served):
    url, _ = served
    keys = {"prompt_tokens", "completion_tokens", "total_tokens", "evicted_prompt_tokens"}
    long_prompt = list(range(300, 400))  # longer than the tiny decoder's cache: its middle is left out
    doc = post_json(url, "/v1/completions", {"model": "dec", "prompt": long_prompt, "max_tokens": 2})[1]
    assert set(doc["usage"]) == keys and doc["usage"]["evicted_prompt_tokens"] > 0, doc
    doc = post_json(url, "/v2/models/dec/generate", _body("/v2/models/dec/generate"))[1]
    assert set(doc["usage"]) == keys, doc
    _, events, _ = sse(url, "/v1/completions", _body("/v1/completions", stream=True,
                                                     stream_options={"include_usage": True}))
    assert set(events[-2]["usage"]) == keys, events[-2]


def test_an_unknown_model_lists_the_decoders_too(served):
    url, _ = served
    status, doc, _ = http(url, "GET", "/v2/models/nope")
    assert status == 404 and "['dec', 'enc']" in doc["error"], doc


def test_a_decoder_only_server_describes_its_model(tiny_decoder):
    from edgeattn.bundle.folder import open_bundle

    _, server = _start([open_bundle(tiny_decoder[3])], ["dec"])
    with server as url:
        wait_ready_http(url)
        status, doc, _ = http(url, "GET", "/v2/models/dec")
        assert status == 200 and doc["name"] == "dec" and doc["platform"] == "edgeattn_decoder", doc
        status, doc, _ = http(url, "GET", "/v2/models/dec/versions/1")
        assert status == 200 and doc["name"] == "dec", doc
        status, doc, _ = http(url, "GET", "/v2/models/deco")
        assert status == 404 and "['dec']" in doc["error"], doc


pytestmark = requires_decoder_stack
