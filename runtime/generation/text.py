"""Tokens <-> text for a decoder bundle: the `tokenizers` model, the chat template, and streamed text that is
always valid UTF-8 (a token that ends inside a multi-byte character waits for the next one)."""

from __future__ import annotations

import json
from pathlib import Path

from edgeattn.errors import InputError, ModelError
from edgeattn.optional import require

REPLACEMENT = "\ufffd"


class TextCodec:
    def __init__(self, tokenizer_json: str, chat_template: str | None, special: dict) -> None:
        tokenizers = require("tokenizers", "text generation")
        try:
            self.tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)
        except Exception as exc:
            raise ModelError(f"the bundle's tokenizer.json could not be read: {exc}") from None
        self.chat_template = chat_template
        self.special = special  # bos_token, eos_token strings for templates

    @classmethod
    def from_files(cls, tokenizer_path: Path, generation: dict) -> "TextCodec":
        if not tokenizer_path.is_file():
            raise ModelError(f"{tokenizer_path.parent}: expected tokenizer.json in a decoder bundle, found none")
        special = {k: v for k, v in (generation.get("special_tokens") or {}).items() if v is not None}
        return cls(tokenizer_path.read_text(encoding="utf-8"), generation.get("chat_template"), special)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise InputError(f"prompt: expected text, found {type(text).__name__}")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict]) -> str:
        """The tokenizer's chat template over `messages`, ending with the assistant's turn."""
        if not self.chat_template:
            raise InputError("chat: this bundle's tokenizer has no chat template; give a plain prompt instead")
        if not isinstance(messages, list) or not messages:
            raise InputError("chat: expected a non-empty list of messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise InputError(f"chat message {i}: expected {{'role': str, 'content': str}}, found {str(m)[:80]!r}")
        jinja2 = require("jinja2", "chat templates")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise InputError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False)
        try:
            template = env.from_string(self.chat_template)
            return template.render(messages=messages, add_generation_prompt=True, **self.special)
        except jinja2.TemplateError as exc:
            raise InputError(f"chat template: {exc}") from None


class TextStream:
    """Incremental detokenization: `push(token)` returns the new text, never a partial UTF-8 character.

    Decoding a few tokens before the new one (not only the new one) keeps the spaces and merges that
    depend on context; text ending in U+FFFD is held back until the character is complete."""

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self.ids: list[int] = []
        self.prefix = 0  # tokens before `read` that give context to the decoder
        self.read = 0  # tokens whose text has been emitted

    def push(self, token: int) -> str:
        self.ids.append(token)
        if self.codec is None:  # a model without a tokenizer generates token ids only
            return ""
        before = self.codec.decode(self.ids[self.prefix:self.read])
        now = self.codec.decode(self.ids[self.prefix:])
        if len(now) > len(before) and not now.endswith(REPLACEMENT):
            self.prefix, self.read = self.read, len(self.ids)
            return now[len(before):]
        return ""

    def flush(self) -> str:
        """What is left at the end (a stream cut inside a character ends with U+FFFD: the honest answer)."""
        if self.codec is None:
            return ""
        before = self.codec.decode(self.ids[self.prefix:self.read])
        now = self.codec.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return now[len(before):]
