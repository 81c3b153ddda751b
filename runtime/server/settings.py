"""Typed, validated settings of the service, from arguments or from EDGEATTN_SERVE_* environment variables."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields

from edgeattn.errors import ConfigError
from edgeattn.runtime.cuda.devices import parse_devices

ENV_PREFIX = "EDGEATTN_SERVE_"
DEFAULT_SLOTS = 8  # decoder bundles other than cuda ones, when the slots are "auto"
AUTO = "auto"  # slots sized by the model: given as this word, held as 0


@dataclass(frozen=True)
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: an ephemeral port (tests)
    max_batch: int = 8  # per model, capped by the bundle's batch range; 1 turns batching off
    max_queue_delay_ms: float = 2.0  # how long the first request of a batch waits for company
    max_queue: int = 256  # queued requests per model; beyond it requests get 503 (back-pressure)
    max_body_bytes: int = 64 << 20  # larger request bodies get 413
    threads: int = 0  # ONNX Runtime intra-op threads (0: its default)
    window: int = 0  # initial attention window (0 = full)
    shutdown_timeout_s: float = 30.0  # graceful shutdown: how long in-flight requests may take
    warmup_runs: int = 2  # inferences per model before it reports ready
    body_timeout_s: float = 30.0  # a request body not received within this gets 408
    header_timeout_s: float = 30.0  # a connection without a whole request header this long after it opened
    # (or after its last answer: an idle keep-alive connection) is closed
    max_generate_body_bytes: int = 1 << 20  # generation routes: larger bodies (decoded) get 413
    max_stops: int = 4  # generation: stop strings per request (OpenAI's limit); more get 400
    max_stop_chars: int = 256  # generation: characters per stop string; longer get 400
    admin_token: str = field(default="", repr=False)  # if set, admin routes need "Authorization: Bearer TOKEN"
    slots: int = 0  # decoder bundles: requests generating at once (one KV-cache row each), batched every step;
    # 0 ("auto"): cuda bundles as many as fit in the GPU's memory (runtime/cuda/memory.py), others DEFAULT_SLOTS
    prefill_chunk: int = 0  # decoder bundles: prompt tokens per prefill step (interleaved with decode steps);
    # 0: the backend's own (16 on a CPU, where such a step costs about one full decode step, docs/serving.md
    # "Where the time goes"; 2,048 on CUDA, where a prefill pass costs about the same up to thousands of tokens)
    prefill_in_step: int = 0  # decoder bundles: prompts up to this long are prefilled inside the decode steps
    prompt_attention: str = "budget"  # decoder bundles: what prompts read, the live budget or the "whole" cache
    window_max: int = 0  # decoder bundles: ring rows per slot (0: the bundle's window_max)
    devices: str = ""  # cuda bundles: "all" or GPU indices "0,1": one engine per GPU ("": one GPU, the current one)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port: expected 0..65535, found {self.port}")
        for name in ("max_batch", "max_queue", "max_body_bytes", "max_generate_body_bytes", "max_stop_chars"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: expected >= 1, found {getattr(self, name)}")
        for name in ("body_timeout_s", "header_timeout_s"):
            if not 0 < getattr(self, name) < math.inf:
                raise ConfigError(f"{name}: expected a number of seconds > 0, found {getattr(self, name)}")
        for name in ("max_queue_delay_ms", "shutdown_timeout_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: expected >= 0, found {getattr(self, name)}")
        for name in ("threads", "window", "warmup_runs", "prefill_in_step", "window_max", "max_stops", "slots",
                     "prefill_chunk"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: expected >= 0, found {getattr(self, name)}")
        if self.devices:
            parse_devices(self.devices)
        if self.prompt_attention not in ("budget", "whole"):
            raise ConfigError(f"prompt_attention: expected one of budget, whole, found {self.prompt_attention!r}")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides) -> "ServeSettings":
        """Defaults, then EDGEATTN_SERVE_<FIELD> variables, then explicit overrides (None = not given)."""
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                if f.name == "slots" and raw.strip().lower() == AUTO:
                    values[f.name] = 0
                    continue
                kind = type(getattr(cls, f.name))
                try:
                    values[f.name] = kind(raw)
                except ValueError:
                    raise ConfigError(f"{ENV_PREFIX}{f.name.upper()}: expected {kind.__name__}, "
                                      f"found {raw!r}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
