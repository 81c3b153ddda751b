"""The attention budget on a real server and a real model (the tiny decoder: 4 sinks, a ring of 48 rows): the
`attention_budget` request field on the OpenAI and Triton routes (validated, reported in every chunk, capping the
live budget for that request alone), the /metrics gauges, and `edgeattn generate --budget`.

References are the Generator run alone on the bundle with the window the capped budget gives: requests with
different budgets batched in one server give each its own tokens."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("aiohttp")

from decoder_fixtures import SINKS, WINDOW_MAX, requires_decoder_stack  # noqa: E402
from serve_support import http, metric_value, post_json, sse, wait_ready_http  # noqa: E402

from edgeattn.cli.main import cli  # noqa: E402

pytestmark = requires_decoder_stack
PROMPT = "The sinks keep the first tokens while the window slides over the rest of a long text"


@pytest.fixture(scope="module")
def served(tiny_decoder):
    from edgeattn.bundle.folder import open_bundle
    from edgeattn.runtime.server.app import create_app
    from edgeattn.runtime.server.runner import BackgroundServer
    from edgeattn.runtime.server.settings import ServeSettings

    app = create_app([open_bundle(tiny_decoder[3])], ServeSettings(port=0, warmup_runs=0, slots=4, prefill_chunk=16),
                     names=["dec"], sensors=False)
    with BackgroundServer(app) as url:
        wait_ready_http(url)
        yield url


def _alone(path, window: int, max_tokens: int) -> str:
    from edgeattn.runtime.generation.generator import GenerationConfig, Generator
    from edgeattn.runtime.generation.sampling import SamplingConfig

    config = GenerationConfig(max_tokens=max_tokens, prefill_chunk=16, window=window,
                              sampling=SamplingConfig(temperature=0.7, seed=5))  # greedy repeats one token here
    with Generator.open(path) as g:
        return g.generate(PROMPT, config).text


def test_requests_with_their_own_budgets_in_one_batch_each_get_their_own_tokens(served, tiny_decoder):
    """Four streams at once (no budget, 20, 36 and 52 rows) on a live budget of the whole ring: each one's text
    equals the Generator's alone at the window its budget leaves above the sinks, and every chunk says so."""
    import threading

    budgets, results = [None, 20, 36, 52], {}

    def ask(i, budget):
        extra = {} if budget is None else {"attention_budget": budget}
        results[i] = sse(served, "/v1/completions", {"model": "dec", "prompt": PROMPT, "max_tokens": 40,
                                                    "temperature": 0.7, "seed": 5, "stream": True, **extra})

    threads = [threading.Thread(target=ask, args=(i, b)) for i, b in enumerate(budgets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    texts = set()
    for i, budget in enumerate(budgets):
        status, events, _ = results[i]
        assert status == 200
        chunks = [e for e in events if e != "[DONE]"]
        rows = budget or SINKS + WINDOW_MAX
        window = 0 if rows == SINKS + WINDOW_MAX else rows - SINKS
        assert all(c["parameters"]["attention_budget"] == rows for c in chunks), chunks[-1]["parameters"]
        assert all(c["parameters"]["attention_window"] == window for c in chunks)
        text = "".join(c["choices"][0]["text"] for c in chunks)
        assert text == _alone(tiny_decoder[3], window, 40), (i, budget)
        texts.add(text)
    assert len(texts) == 3  # the budgets change the answers (the whole ring twice: None and 52)


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/v2/models/dec/generate"])
@pytest.mark.parametrize("bad, found", [(True, "boolean 'True'"), (36.0, "number '36.0'"), ("36", "string '36'"),
                                        (19, "found 19"), (53, "found 53")])
def test_a_bad_attention_budget_is_a_400_naming_what_was_expected(served, route, bad, found):
    if route.startswith("/v2"):
        doc = {"text_input": "Hi", "parameters": {"max_tokens": 2, "attention_budget": bad}}
    elif "chat" in route:
        doc = {"model": "dec", "messages": [{"role": "user", "content": "Hi"}], "attention_budget": bad}
    else:
        doc = {"model": "dec", "prompt": "Hi", "max_tokens": 2, "attention_budget": bad}
    status, body, _ = post_json(served, route, doc)
    assert status == 400, body
    message = body["error"]["message"] if isinstance(body["error"], dict) else body["error"]
    assert message.startswith("attention_budget: expected") and found in message, message
    if isinstance(body["error"], dict):
        assert body["error"]["param"] == "attention_budget"


def test_the_triton_route_and_a_whole_answer_report_the_budget(served):
    status, doc, _ = post_json(served, "/v2/models/dec/generate",
                               {"text_input": PROMPT, "parameters": {"max_tokens": 3, "attention_budget": 20}})
    assert status == 200 and doc["parameters"]["attention_budget"] == 20 and doc["parameters"]["attention_window"] == 16
    status, doc, _ = post_json(served, "/v1/completions", {"model": "dec", "prompt": PROMPT, "max_tokens": 3})
    assert status == 200 and doc["parameters"]["attention_budget"] == SINKS + WINDOW_MAX


def test_metrics_show_the_live_budget_next_to_the_window(served):
    def scrape():
        import urllib.request

        with urllib.request.urlopen(f"http://{served}/metrics", timeout=30) as response:
            text = response.read().decode()
        return (metric_value(text, "edgeattn_attention_window"),
                metric_value(text, "edgeattn_attention_budget_rows", 'model="dec"'),
                metric_value(text, "edgeattn_attention_budget_pages", 'model="dec"'))

    assert scrape() == (0.0, float(SINKS + WINDOW_MAX), 0.0)
    status, _, _ = post_json(served, "/v2/admin/window", {"window": 16})
    try:
        assert status == 200 and scrape() == (16.0, float(SINKS + 16), 0.0)
        state = http(served, "GET", "/v2/admin/window")[1]
        assert state["window"] == 16 and state["pages"] == 0
    finally:
        post_json(served, "/v2/admin/window", {"window": 0})


def _generate(runner, path, *extra):
    return runner.invoke(cli, ["generate", str(path), "--prompt", PROMPT, "--raw", "--max-tokens", "12", "--json",
                               *extra])


def test_generate_budget_equals_the_window_it_leaves_when_it_holds_no_page(tiny_decoder, runner):
    """A budget of 20 rows (4 sinks + 16) holds one page, all of it recent: the window 16, exactly."""
    path = tiny_decoder[3]
    by_budget = _generate(runner, path, "--budget", "20")
    by_window = _generate(runner, path, "--window", "16")
    assert by_budget.exit_code == 0 and by_window.exit_code == 0, by_budget.output + by_window.output
    got, want = json.loads(by_budget.stdout), json.loads(by_window.stdout)
    assert got["tokens"] == want["tokens"]
    assert (got["attention_budget"], got["attention_window"]) == (20, 16)


@pytest.mark.parametrize("extra, message", [
    (["--budget", "19"], "attention budget: expected 20 (sinks + one page) to 52 (the cache's rows), found 19"),
    (["--budget", "53"], "found 53"),
    (["--budget", "36", "--window", "16"], "expected --window or --budget, found both"),
    (["--budget-recent", "0.5"], "--budget-recent splits a budget: give --budget N too"),
    (["--budget", "36", "--budget-recent", "1.5"], "budget_recent: expected a fraction from 0 to 1, found 1.5"),
])
def test_generate_budget_errors_are_one_line(tiny_decoder, runner, extra, message):
    result = _generate(runner, tiny_decoder[3], *extra)
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_generate_budget_with_pages_on_a_bundle_without_them_is_a_clear_error(tiny_decoder, runner):
    """36 rows at recent 0.25: a window of 16 and one page; the tiny bundle was exported without pages, so the
    answer is one line that says so (a budget without pages, 20 rows, runs: above)."""
    result = _generate(runner, tiny_decoder[3], "--budget", "36")
    assert result.exit_code == 2 and "retrieval pages" in result.output, result.output
    assert "Traceback" not in result.output


def test_serve_refuses_a_budget_policy_on_a_bundle_that_reads_no_pages(tiny_decoder, runner, tmp_path):
    """Refused at start-up, not after the device heats (when every request would fail)."""
    from edgeattn.runtime.thermal.offline.example_trace import path as trace_path

    policy = tmp_path / "budget.toml"
    policy.write_text('kind = "step"\nthresholds_c = [75, 85]\nbudget = {recent = 0.25}\n')
    result = runner.invoke(cli, ["serve", str(tiny_decoder[3]), "--port", "0", "--thermal-policy", str(policy),
                                 "--thermal-sensor", f"replay:{trace_path()}"])
    assert result.exit_code == 2, result.output
    assert "--thermal-policy: a budget policy (recent 0.25) cannot run on" in result.output
    assert "retrieval pages" in result.output and "Traceback" not in result.output
