"""The passes `edgeattn build` runs, in order. Each entry names a module and a class, loaded lazily."""

from __future__ import annotations

import importlib

from edgeattn.errors import ConfigError
from edgeattn.passes import GraphPass

PASSES: dict[str, str] = {
    "inference-mode": "edgeattn.passes.inference_mode:InferenceMode",  # refuse or strip training-mode nodes first
    "upgrade-opset": "edgeattn.passes.upgrade_opset:UpgradeOpset",  # opsets 13-17 -> 18, before fusion
    "fuse-attention": "edgeattn.passes.fuse_attention:FuseAttention",
    "attention-body": "edgeattn.passes.attention_body:AttentionBody",
    "fuse-rmsnorm-cpu": "edgeattn.passes.rmsnorm_cpu:FuseRmsNormForCpu",
    "fuse-rotary-cpu": "edgeattn.passes.rotary_cpu:FuseRotaryForCpu",
    "lower-cached-cpu": "edgeattn.passes.cached_attention_cpu:LowerCachedAttentionForCpu",  # after fuse-rotary-cpu: reads its tables
    "logits-to-keep": "edgeattn.passes.logits_to_keep:LogitsToKeep",  # decoders: the LM head for the last positions
    "pack-matmuls-cpu": "edgeattn.passes.pack_matmuls_cpu:PackMatMulsForCpu",  # Q/K/V, gate/up: one product each
    "cleanup": "edgeattn.passes.cleanup:Cleanup",
    "check-sparsity": "edgeattn.passes.check_sparsity:CheckSparsity",  # before lower-qdq-cpu rewrites the MatMuls
    "lower-qdq-cpu": "edgeattn.passes.qdq_cpu:LowerQdqMatMulForCpu",
    "fuse-gelu-cpu": "edgeattn.passes.gelu_cpu:FuseGeluForCpu",
}

DEFAULT_PASSES: tuple[str, ...] = tuple(PASSES)


def load_pass(name: str) -> GraphPass:
    try:
        module, attr = PASSES[name].split(":")
    except KeyError:
        raise ConfigError(f"unknown graph pass {name!r}: expected one of {', '.join(PASSES)}") from None
    return getattr(importlib.import_module(module), attr)()
