"""Fuzzing the inference, admin and generation routes: no input is a 500.

From the server's own OpenAPI description (schemathesis: structure and types), then well-formed requests
with arbitrary values (hypothesis: ids, shapes; generation bodies with odd unicode, stop lists, numbers of any
size and content codings). Deterministic (derandomized) and bounded: a fixed number of examples per route, on
127.0.0.1 only.
"""

from __future__ import annotations

import pytest

pytest.importorskip("aiohttp")
schemathesis = pytest.importorskip("schemathesis")

import json  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgeattn import __version__  # noqa: E402
from edgeattn.runtime.server.app import create_app  # noqa: E402
from edgeattn.runtime.server.openapi import openapi_document  # noqa: E402
from edgeattn.runtime.server.runner import BackgroundServer  # noqa: E402
from edgeattn.runtime.server.settings import ServeSettings  # noqa: E402
from serve_support import http, make_bundle, tiny_bundle, wait_ready_http, window_model  # noqa: E402

DESCRIPTION = openapi_document(__version__, ["tiny", "windowed"], ["attention_mask", "input_ids"],
                               ["hidden", "last_hidden_state"])
schema = schemathesis.openapi.from_dict(DESCRIPTION)
GEN_DESCRIPTION = openapi_document(__version__, ["tiny"], ["attention_mask", "input_ids"], ["last_hidden_state"],
                                   decoders=["dec"])
gen_schema = schemathesis.openapi.from_dict(GEN_DESCRIPTION)


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    bundles = [tiny_bundle(folder), make_bundle(folder, window_model(), "windowed")]
    app = create_app(bundles, ServeSettings(port=0, warmup_runs=0, max_queue_delay_ms=0, body_timeout_s=5),
                     sensors=False)
    yield from _serve(app)


FUZZ = settings(derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _serve(app):
    with BackgroundServer(app) as url:
        wait_ready_http(url)
        yield f"http://{url}"


def _described(base_url: str) -> dict:
    status, doc, _ = http(base_url[len("http://"):], "GET", "/openapi.json")
    assert status == 200
    return doc


def _no_server_error(case, base_url: str):
    response = case.call(base_url=base_url, timeout=30)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])
    return response


def operations(selected) -> list:
    """The selected operations as pytest parameters named by their label ("POST /v2/models/{model_name}/infer").

    Not schemathesis's own `parametrize()`: it gives every operation the test's one id, and pytest -n, which
    schedules by id, then runs the first operation alone."""
    return [pytest.param(op, id=op.label) for op in (r.ok() for r in selected.get_all_operations())]


def cases(operation):
    """Valid and invalid requests for one operation (schemathesis's positive and negative generation)."""
    return st.one_of([operation.as_strategy(generation_mode=mode) for mode in schemathesis.GenerationMode])


@pytest.mark.parametrize("operation", operations(schema.include(path_regex="infer|admin")))
def test_no_request_is_a_server_error(operation, base_url):
    @given(case=cases(operation))
    @settings(FUZZ, max_examples=30)
    def check(case):
        response = _no_server_error(case, base_url)
        if response.status_code >= 400:
            assert "error" in response.json(), response.text[:300]

    check()


_ids = st.lists(st.one_of(st.integers(0, 999), st.integers(-2**64, 2**64), st.floats(allow_nan=True)),
                min_size=0, max_size=40)


@given(ids=_ids, rows=st.integers(0, 3), binary=st.booleans())
@settings(max_examples=100, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_token_ids_of_any_value_are_answered_or_refused(base_url, ids, rows, binary):
    """Well-formed requests with arbitrary ids and shapes: 200 exactly when every id and size is valid."""
    url = base_url[len("http://"):]
    cols = len(ids) // rows if rows else 0
    shape = [rows, cols]
    data = ids[:rows * cols]
    body = json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": shape, "data": data}],
                       "parameters": {"binary_data_output": binary}}).encode()
    status, doc, _ = http(url, "POST", "/v2/models/windowed/infer", body, {"Content-Type": "application/json"})
    valid = (1 <= rows <= 8 and 1 <= cols <= 32
             and all(isinstance(v, int) and 0 <= v <= 999 for v in data))
    assert status == (200 if valid else 400), (shape, data, status, doc)


@given(head=st.dictionaries(st.sampled_from(["inputs", "outputs", "parameters", "id"]),
                            st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                                         lambda inner: st.lists(inner, max_size=3)
                                         | st.dictionaries(st.text(max_size=18), inner, max_size=4),
                                         max_leaves=12)),
       tail=st.binary(max_size=64), length=st.one_of(st.none(), st.integers(-5, 400), st.text("0123456789-x .", max_size=4)))
@settings(max_examples=100, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_binary_extension_bodies_are_answered_or_refused(base_url, head, tail, length):
    """JSON headers of any structure, any trailing bytes, any header length: never a 500."""
    url = base_url[len("http://"):]
    raw = json.dumps(head).encode()
    headers = {} if length is None else {"Inference-Header-Content-Length": str(length)}
    status, doc, _ = http(url, "POST", "/v2/models/tiny/infer", raw + tail, headers)
    assert status < 500, (head, tail, length, status, doc)


@pytest.fixture(scope="module")
def gen_url(tmp_path_factory, request):
    """An encoder ("tiny") and the tiny decoder ("dec") in one server (needs the decoder stack)."""
    from decoder_fixtures import requires_decoder_stack

    if requires_decoder_stack.args[0]:
        pytest.skip(requires_decoder_stack.kwargs["reason"])
    from edgeattn.bundle.folder import open_bundle

    decoder = request.getfixturevalue("tiny_decoder")[3]
    folder = tmp_path_factory.mktemp("fuzz_gen")
    app = create_app([tiny_bundle(folder), open_bundle(decoder)],
                     ServeSettings(port=0, warmup_runs=0, max_queue_delay_ms=0, body_timeout_s=5, slots=4),
                     names=["tiny", "dec"], sensors=False)
    yield from _serve(app)


@pytest.mark.parametrize("server, description, routes", [
    ("base_url", DESCRIPTION, {"/v2/models/{model}/infer", "/v2/admin/window", "/v2/admin/window/lock"}),
    ("gen_url", GEN_DESCRIPTION, {"/v1/completions", "/v1/chat/completions", "/v2/models/{model}/generate_stream"}),
])
def test_the_description_is_served_and_names_every_route(request, server, description, routes):
    doc = _described(request.getfixturevalue(server))
    assert doc == description and routes <= set(doc["paths"])


@pytest.mark.parametrize("operation", operations(gen_schema.include(path_regex="v1|generate")))
def test_no_generation_request_is_a_server_error(operation, gen_url):
    @given(case=cases(operation))
    @settings(FUZZ, max_examples=15)
    def check(case):
        response = _no_server_error(case, gen_url)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert isinstance(error, str) or {"message", "type", "param", "code"} <= set(error), response.text[:300]

    check()


# --- generation bodies: well-formed JSON with odd values, any content coding --------------------------------
HUGE = "@HUGE@"  # replaced by an integer of 4,400 digits in the JSON text (json.dumps cannot write one)
_odd_text = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=24),  # lone surrogates, controls, private use
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "\u202e\u0301\u200d", "\U0001f525" * 3, "\ufeff", "\r\n\t"]),
    st.text(max_size=400))
_number = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.integers(-10**400, 10**400),
                    st.just(HUGE), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3))
_stop = st.one_of(st.none(), _odd_text, st.lists(_odd_text, max_size=6),
                  st.lists(st.text(min_size=250, max_size=300), min_size=1, max_size=2))
_tokens = st.one_of(st.integers(1, 3), st.integers(-2, 0), st.integers(10**6, 10**400), st.just(HUGE),
                    st.floats(allow_nan=True), st.text(max_size=2))


@st.composite
def _generation_request(draw):
    route = draw(st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v2/models/dec/generate",
                                  "/v2/models/dec/generate_stream"]))
    text = draw(_odd_text)
    if route == "/v1/chat/completions":
        doc = {"model": "dec", "messages": [{"role": draw(st.sampled_from(["user", "system", "\ud800"])),
                                             "content": text}]}
    elif route == "/v1/completions":
        doc = {"model": "dec", "prompt": draw(st.one_of(st.just(text), st.lists(st.integers(-5, 60_000),
                                                                                  max_size=8)))}
    else:
        doc = {"text_input": text}
    doc["max_tokens"] = draw(_tokens)
    for key in draw(st.sets(st.sampled_from(["temperature", "top_p", "seed", "n", "best_of"]), max_size=3)):
        doc[key] = draw(_number)
    doc["stop"] = draw(_stop)
    doc["stream"] = draw(st.one_of(st.none(), st.booleans(), _number)) if route.startswith("/v1") else None
    return route, doc


def _encoded(raw: bytes, coding: str | None) -> tuple[bytes, dict]:
    import gzip
    import zlib

    headers = {"Content-Type": "application/json"}
    if coding is None:
        return raw, headers
    body = {"gzip": gzip.compress, "deflate": zlib.compress, "identity": lambda b: b,
            "corrupt gzip": lambda b: gzip.compress(b)[:-5], "br": lambda b: b}[coding](raw)
    return body, {**headers, "Content-Encoding": coding.split()[-1]}


@given(generation=_generation_request(),
       coding=st.sampled_from([None, None, "gzip", "deflate", "identity", "corrupt gzip", "br"]))
@settings(max_examples=80, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_generation_bodies_of_any_value_are_answered_or_refused(gen_url, generation, coding):
    """Odd unicode (lone surrogates included), stop lists of any size, numbers of any size, content codings:
    never a 500, and every refusal in its route's error shape."""
    route, doc = generation
    raw = json.dumps(doc).replace(json.dumps(HUGE), "9" * 4400).encode()
    body, headers = _encoded(raw, coding)
    status, answer, _ = http(gen_url[len("http://"):], "POST", route, body, headers)
    assert status < 500, (route, doc, coding, status, answer)
    if status >= 400:
        error = answer["error"]
        assert isinstance(error, dict) if route.startswith("/v1") else isinstance(error, str), answer
