"""Every graph pass by name: a module and a class, loaded when a plan runs it (`edgeattn.passes.plans`)."""

from __future__ import annotations

import importlib
from typing import Callable

from edgeattn.errors import ConfigError
from edgeattn.passes import GraphPass

PASSES: dict[str, str | Callable[[], GraphPass]] = {
    "inference-mode": "edgeattn.passes.inference_mode:InferenceMode",
    "upgrade-opset": "edgeattn.passes.upgrade_opset:UpgradeOpset",
    "fuse-attention": "edgeattn.passes.fuse_attention:FuseAttention",
    "attention-body": "edgeattn.passes.attention_body:AttentionBody",
    "fuse-rmsnorm-cpu": "edgeattn.passes.rmsnorm_cpu:FuseRmsNormForCpu",
    "fuse-rotary-cpu": "edgeattn.passes.rotary_cpu:FuseRotaryForCpu",
    "lower-cached-cpu": "edgeattn.passes.cached_attention_cpu:LowerCachedAttentionForCpu",
    "logits-to-keep": "edgeattn.passes.logits_to_keep:LogitsToKeep",
    "pack-matmuls-cpu": "edgeattn.passes.pack_matmuls_cpu:PackMatMulsForCpu",
    "cleanup": "edgeattn.passes.cleanup:Cleanup",
    "check-sparsity": "edgeattn.passes.check_sparsity:CheckSparsity",
    "lower-qdq-cpu": "edgeattn.passes.qdq_cpu:LowerQdqMatMulForCpu",
    "fuse-gelu-cpu": "edgeattn.passes.gelu_cpu:FuseGeluForCpu",
}


def register(name: str, factory: str | Callable[[], GraphPass]) -> None:
    """Make a pass known by name ("module:Class", or anything that returns a pass), so a plan can name it."""
    if name in PASSES and PASSES[name] != factory:
        raise ConfigError(f"graph pass {name!r}: expected a new name, found one already registered ({PASSES[name]})")
    PASSES[name] = factory


def load_pass(name: str) -> GraphPass:
    try:
        factory = PASSES[name]
    except KeyError:
        raise ConfigError(f"unknown graph pass {name!r}: expected one of {', '.join(PASSES)}") from None
    if callable(factory):
        return factory()
    module, attr = factory.split(":")
    return getattr(importlib.import_module(module), attr)()
