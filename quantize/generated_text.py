"""Distillation text written by a language model: broad English when no (or too little) real text is at hand.

A student distilled from its teacher only learns to match it on the text it sees; a few hundred news
documents leave the rest of the language unseen. `generate_documents` asks a causal LM (an instruct
model such as SmolLM2) for short texts across many genres and topics, sampling, so the distillation text
covers far more ground. The output is one document a line: what `edgeattn sparsify --calib` and
`edgeattn.text.read_texts` take. For a decoder, text sampled from the teacher itself is also the distribution its KL
loss is measured on.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from edgeattn import atomic, hf_models
from edgeattn.errors import ConfigError, InputError, ModelError
from edgeattn.gpu import resolve_device
from edgeattn.optional import require

GENRES = (
    "a short movie review", "a restaurant review", "a product review with pros and cons", "a news report",
    "a sports match report", "an encyclopedia paragraph", "a personal blog post", "a short story",
    "a letter to a friend", "a dialogue between two people", "a travel diary entry", "an opinion column",
    "a how-to guide", "a science explainer for teenagers", "a book review", "a complaint to a company",
    "a job advertisement", "a weather forecast", "a history lesson", "a short speech",
)
TOPICS = (
    "a family trip to the mountains", "a new smartphone", "a jazz concert", "climate change", "a football final",
    "the history of Rome", "a small bakery", "learning to play the guitar", "a horror film", "a romantic comedy",
    "an animated film for children", "a war drama", "a documentary about the ocean", "a science fiction film",
    "an election", "a hospital", "a stock market crash", "a cat that got lost", "a wedding", "a job interview",
    "a volcano", "electric cars", "a chess tournament", "a rainy Monday", "a museum of modern art",
    "the invention of printing", "a farmer's market", "a space telescope", "a school play", "vaccines",
    "a marathon", "a haunted house", "a cooking competition", "an old friend", "a bicycle repair shop",
    "a thriller novel", "a video game", "a flood in a small town", "a startup company", "the moon landing",
    "a garden in spring", "a noisy neighbour", "a train journey", "a classical composer", "a comedy show",
    "a tennis player", "honey bees", "a detective", "a new law on housing", "a birthday party",
    "a disappointing sequel", "an overrated actor", "a brilliant director", "a boring lecture", "a festival",
    "a cheap hotel", "the Amazon rainforest", "a robot", "a medieval castle", "a musical",
)


@dataclass(frozen=True)
class GenerateConfig:
    docs: int = 1024
    max_new_tokens: int = 192
    batch: int = 64
    temperature: float = 0.9
    top_p: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if self.docs < 1 or self.batch < 1 or self.max_new_tokens < 1:
            raise ConfigError(f"docs/batch/max_new_tokens: expected >= 1, found "
                              f"{self.docs}/{self.batch}/{self.max_new_tokens}")
        if not self.temperature > 0 or not 0 < self.top_p <= 1:
            raise ConfigError(f"temperature/top_p: expected > 0 and (0, 1], found {self.temperature}/{self.top_p}")


def prompts(n: int, seed: int = 0) -> list[str]:
    """n requests, genre x topic, drawn with replacement in a seeded order."""
    rng = random.Random(seed)
    return [f"Write {rng.choice(GENRES)} about {rng.choice(TOPICS)}." for _ in range(n)]


def generate_documents(model, tokenizer, config: GenerateConfig = GenerateConfig(),
                       progress: Callable[[str], None] = lambda msg: None) -> list[str]:
    """config.docs sampled texts, one string each (newlines folded to spaces, empty answers dropped)."""
    torch = require("torch", "generating distillation text")
    torch.manual_seed(config.seed)
    device = next(model.parameters()).device
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # batched generation continues from the right edge
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    chat = getattr(tokenizer, "chat_template", None) is not None
    out: list[str] = []
    try:
        requests = prompts(config.docs, config.seed)
        for i in range(0, config.docs, config.batch):
            texts = requests[i:i + config.batch]
            if chat:
                texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                       add_generation_prompt=True) for t in texts]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not chat).to(device)
            with torch.no_grad():
                ids = model.generate(**enc, do_sample=True, temperature=config.temperature, top_p=config.top_p,
                                     max_new_tokens=config.max_new_tokens, pad_token_id=tokenizer.pad_token_id)
            new = ids[:, enc["input_ids"].shape[1]:]  # new: [B, <= max_new_tokens]
            for text in tokenizer.batch_decode(new, skip_special_tokens=True):
                text = " ".join(text.split())
                if text:
                    out.append(text)
            progress(f"{min(i + config.batch, config.docs)}/{config.docs} documents")
    finally:
        tokenizer.padding_side = side
    return out


def write_documents(docs: list[str], path: str | Path) -> Path:
    """One document a line, written atomically."""
    path = Path(path)
    atomic.write_text(path, "\n".join(docs) + "\n")
    return path


def write_distill_text(model_name: str | Path, out: str | Path, config: GenerateConfig = GenerateConfig(),
                       device: str = "cpu", progress: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
    """Load a causal LM (bf16 on CUDA), sample `config.docs` documents into `out`; returns the manifest."""
    torch = require("torch", "generating distillation text")
    device = resolve_device(device)  # a CUDA device that is not there fails before the model loads
    model, tok, kind = hf_models.load(model_name, attn_implementation="sdpa")
    if kind != "decoder":
        raise ModelError(f"{model_name}: expected a causal language model to write text, found an encoder")
    model = model.to(device, torch.bfloat16 if str(device).startswith("cuda") else torch.float32)
    started = time.time()
    docs = generate_documents(model, tok, config, progress)
    if not docs:
        raise InputError(f"{model_name}: expected text from {config.docs} requests, found only empty answers")
    write_documents(docs, out)
    return {"model": str(model_name), "out": str(out), "config": asdict(config), "device": str(device),
            "documents": len(docs), "words": sum(len(d.split()) for d in docs),
            "seconds": round(time.time() - started, 1)}
