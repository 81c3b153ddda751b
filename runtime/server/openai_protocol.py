"""The OpenAI-compatible request and response shapes (completions, chat completions) and Triton's generate
extension: parsing a JSON body into a `TextRequest`, building responses and stream chunks, and OpenAI's error
shape `{"error": {"message", "type", "param", "code"}}`.

One extension field: `attention_budget` (an integer number of cache rows, sinks + window + retrieval pages)
caps the server's live attention budget for this request; clients that do not send it get the live budget.
Responses and stream chunks carry `parameters` with the window and the budget each request ran with."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

from edgeattn.attention.ring import RingLayout
from edgeattn.errors import ConfigError
from edgeattn.runtime.generation.engine import check_request_budget
from edgeattn.runtime.generation.sampling import SamplingConfig

MAX_STOPS = 4  # stop strings per request, as OpenAI (ServeSettings.max_stops)
MAX_STOP_CHARS = 256  # characters per stop string (ServeSettings.max_stop_chars)
BUDGET_PARAMETER = "attention_budget"  # request field and response parameter: cache rows read at most


class OpenAIError(Exception):
    """A request the generation routes refuse: HTTP `status` and OpenAI's error object."""

    def __init__(self, message: str, status: int = 400, *, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.type, self.code = status, param, type, code

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class TextRequest:
    """A validated generation request: `prompt` is text, token ids, or chat messages."""

    model: str
    prompt: str | list[int] | list[dict]
    max_tokens: int
    sampling: SamplingConfig
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    chat: bool
    attention_budget: int | None = None  # rows; caps the live budget for this request (None: the live budget)


def _type_name(value) -> str:
    return "null" if value is None else {bool: "boolean", int: "integer", float: "number", str: "string",
                                         list: "array", dict: "object"}.get(type(value), type(value).__name__)


def _short(value, chars: int = 60) -> str:
    """`value` for a message, cut to `chars` characters (a number of thousands of digits included)."""
    text = str(value)
    return text if len(text) <= chars else f"{text[:chars]}... ({len(text)} characters)"


def _wrong(param: str, expected: str, value) -> OpenAIError:
    return OpenAIError(f"{param}: expected {expected}, found {_type_name(value)} {_short(value)!r}", param=param)


def _text(value: str, param: str) -> str:
    """`value` if it is valid Unicode: JSON's escapes can carry half a surrogate pair ("\\ud800"), which no
    tokenizer or encoder takes."""
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise OpenAIError(f"{param}: expected valid Unicode text, found a lone surrogate "
                              f"{value[exc.start]!r} at character {exc.start}", param=param) from None
    return value


def _integer(doc: dict, key: str, default):
    value = doc.get(key)
    if value is None:  # absent or null: the default, as OpenAI
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong(key, "an integer", value)
    return value


def _number(doc: dict, key: str, default: float, low: float, high: float, *, open_low: bool = False) -> float:
    value = doc.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise _wrong(key, "a number", value)
    if value > high or value < low or (open_low and value == low):  # exact for integers of any size
        bound = f"({low:g}, {high:g}]" if open_low else f"[{low:g}, {high:g}]"
        raise OpenAIError(f"{key}: expected a number in {bound}, found {_short(value)}", param=key)
    return float(value)


def _stops(doc: dict, max_stops: int, max_chars: int) -> tuple[str, ...]:
    value = doc.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _wrong("stop", "a string or a list of strings", value)
    if len(stops) > max_stops:
        raise OpenAIError(f"stop: expected at most {max_stops} strings, found {len(stops)}", param="stop")
    long = next((s for s in stops if len(s) > max_chars), None)
    if long is not None:
        raise OpenAIError(f"stop: expected strings of at most {max_chars} characters, found one of {len(long)}",
                          param="stop")
    return tuple(_text(s, "stop") for s in stops if s)


def _boolean(doc: dict, key: str) -> bool:
    value = doc.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _wrong(key, "a boolean", value)
    return value


def _prompt(doc: dict):
    if "prompt" not in doc:
        raise OpenAIError("prompt: expected a string or a list of token ids, found none", param="prompt")
    value = doc["prompt"]
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # one prompt in a batch of one
    if isinstance(value, str):
        if not value:
            raise OpenAIError("prompt: expected at least one character, found an empty string", param="prompt")
        return _text(value, "prompt")
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    if isinstance(value, list) and len(value) > 1 and all(isinstance(p, (str, list)) for p in value):
        raise OpenAIError(f"prompt: a batch of {len(value)} prompts is not supported: send one request per prompt",
                          param="prompt")
    raise _wrong("prompt", "a non-empty string or a non-empty list of token ids", value)


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        content = "".join(p["text"] for p in content)
    if isinstance(content, str):
        return _text(content, f"messages[{i}].content")
    raise _wrong(f"messages[{i}].content", "a string or a list of text parts", content)


def _messages(doc: dict) -> list[dict]:
    value = doc.get("messages")
    if not isinstance(value, list):
        raise _wrong("messages", "a list of messages", value)
    if not value:
        raise OpenAIError("messages: expected at least one message, found an empty list", param="messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _wrong(f"messages[{i}]", "an object with a string 'role'", m)
        out.append({"role": _text(m["role"], f"messages[{i}].role"), "content": _content(m, i)})
    return out


def parse_text_request(doc, *, chat: bool, max_tokens_limit: int, max_stops: int = MAX_STOPS,
                       max_stop_chars: int = MAX_STOP_CHARS) -> TextRequest:
    """Validate an OpenAI completions (chat=False) or chat completions body; OpenAIError names the field."""
    if not isinstance(doc, dict):
        raise OpenAIError(f"request body: expected a JSON object, found {_type_name(doc)}")
    model = doc.get("model")
    if not isinstance(model, str):
        raise _wrong("model", "a string", model)
    n = _integer(doc, "n", 1)
    if n != 1:
        raise OpenAIError(f"n: only n = 1 is supported (one choice per request), found {_short(n)}", param="n")
    best_of = _integer(doc, "best_of", None)
    if best_of not in (None, 1):
        raise OpenAIError(f"best_of: only 1 is supported, found {_short(best_of)}", param="best_of")
    key = "max_tokens"
    if chat and doc.get("max_completion_tokens") is not None:
        key = "max_completion_tokens"
    max_tokens = _integer(doc, key, None)
    if max_tokens is None:
        max_tokens = min(16 if not chat else 256, max_tokens_limit)
    if not 1 <= max_tokens <= max_tokens_limit:
        raise OpenAIError(f"{key}: expected 1..{max_tokens_limit} (this model's limit), "
                          f"found {_short(max_tokens)}", param=key)
    seed = _integer(doc, "seed", None)
    if seed is not None and seed < 0:
        raise OpenAIError(f"seed: expected an integer >= 0, found {_short(seed)}", param="seed")
    sampling = SamplingConfig(temperature=_number(doc, "temperature", 1.0, 0.0, 2.0),
                              top_p=_number(doc, "top_p", 1.0, 0.0, 1.0, open_low=True), seed=seed)
    stream = _boolean(doc, "stream")
    options = doc.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _wrong("stream_options", "an object", options)
    include_usage = _boolean(options or {}, "include_usage")
    if include_usage and not stream:
        raise OpenAIError("stream_options: only allowed when stream is true", param="stream_options")
    prompt = _messages(doc) if chat else _prompt(doc)
    stops = _stops(doc, max_stops, max_stop_chars)
    budget = _integer(doc, BUDGET_PARAMETER, None)
    return TextRequest(model, prompt, max_tokens, sampling, stops, stream, include_usage, chat, budget)


def check_budget(req: TextRequest, layout: RingLayout) -> None:
    """The request's attention_budget against the model's cache: sinks + one page to the cache's rows."""
    if req.attention_budget is not None:
        try:
            check_request_budget(layout, req.attention_budget)
        except ConfigError as exc:
            raise OpenAIError(str(exc), param=BUDGET_PARAMETER) from None


def parse_triton_generate(doc, model: str, *, max_tokens_limit: int, stream: bool, max_stops: int = MAX_STOPS,
                          max_stop_chars: int = MAX_STOP_CHARS) -> TextRequest:
    """Triton's generate extension: {"text_input": str, "parameters": {...}} (parameters may also be given at
    the top level: max_tokens, temperature, top_p, seed, stop, attention_budget)."""
    if not isinstance(doc, dict):
        raise OpenAIError(f"request body: expected a JSON object, found {_type_name(doc)}")
    text = doc.get("text_input")
    if not isinstance(text, str) or not text:
        raise _wrong("text_input", "a non-empty string", text)
    _text(text, "text_input")
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise _wrong("parameters", "an object", params)
    merged = {**{k: v for k, v in doc.items() if k not in ("text_input", "parameters", "id")}, **params}
    merged.update(model=model, prompt=text, temperature=merged.get("temperature", 0.0), stream=stream)
    merged.pop("stream_options", None)
    return parse_text_request(merged, chat=False, max_tokens_limit=max_tokens_limit, max_stops=max_stops,
                              max_stop_chars=max_stop_chars)


def request_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int, evicted: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "evicted_prompt_tokens": evicted}


def completion_body(req: TextRequest, rid: str, created: int, text: str, finish: str, usage_: dict,
                    parameters: dict) -> dict:
    if req.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion" if req.chat else "text_completion", "created": created,
            "model": req.model, "choices": [choice], "usage": usage_, "parameters": parameters}


def chunk_body(req: TextRequest, rid: str, created: int, text: str | None, finish: str | None,
               parameters: dict, *, role: bool = False) -> dict:
    if req.chat:
        delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    body = {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion", "created": created,
            "model": req.model, "choices": [choice], "parameters": parameters}
    if req.include_usage:
        body["usage"] = None
    return body


def usage_chunk(req: TextRequest, rid: str, created: int, usage_: dict) -> dict:
    return {"id": rid, "object": "chat.completion.chunk" if req.chat else "text_completion", "created": created,
            "model": req.model, "choices": [], "usage": usage_}


def now() -> int:
    return int(time.time())
