"""SmoothQuant-style equivalence scaling before W8A8 quantization (Xiao et al. 2023).

Per-tensor int8 activations lose most of their resolution to a few outlier channels (in Llama-family
decoders: the inputs of the MLP down-projection and the normalised residual stream). For a Linear whose
input is produced by a per-channel-scalable op, dividing that producer's channel j by s_j and multiplying
the Linear's input column j by s_j leaves the float function unchanged and moves the outliers into the
weight, which is quantized per output channel:

    s_j = max|X_j|^alpha / max|W_:,j|^(1 - alpha)

Producers handled (exact rewrites, checked by tests to float rounding):
  * RMSNorm / LayerNorm weight (and bias)  -> the Linears that read it (q/k/v, gate/up; BERT q/k/v)
  * up_proj rows                           -> down_proj   (down's input is silu(gate) * up)
  * v_proj rows (per kv head)              -> o_proj      (attention output is linear in V; GQA aware)

A layer with no scalable producer (e.g. a tied lm_head, or BERT's GELU MLP) is left as is and reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from edgeattn.errors import ConfigError


@dataclass(frozen=True)
class SmoothConfig:
    alpha: float = 0.5  # migration strength: 0 = keep all difficulty in activations, 1 = all in weights
    calib_batches: int = 8

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"smoothing alpha: expected 0 <= alpha <= 1, found {self.alpha}")
        if self.calib_batches < 1:
            raise ConfigError(f"smoothing calib_batches: expected >= 1, found {self.calib_batches}")


@dataclass
class SmoothReport:
    alpha: float
    smoothed: dict[str, str] = field(default_factory=dict)  # consumer linear -> producer
    skipped: dict[str, str] = field(default_factory=dict)  # linear -> reason
    max_scale: float = 0.0

    def as_dict(self) -> dict:
        return {"alpha": self.alpha, "smoothed": self.smoothed, "skipped": self.skipped,
                "max_scale": round(self.max_scale, 3)}


@dataclass
class _Group:
    producer: str  # module name
    kind: str  # "norm" | "linear_rows" | "v_to_o"
    consumers: list[str]
    group: int = 1  # v_to_o: query heads per kv head
    head_dim: int = 0


def find_groups(model: nn.Module) -> list[_Group]:
    """Producer -> consumer groups of a Llama-family decoder or a BERT encoder, found by module names."""
    mods = dict(model.named_modules())
    groups: list[_Group] = []
    for name, m in mods.items():
        attn = getattr(m, "self_attn", None)
        mlp = getattr(m, "mlp", None)
        if attn is not None and mlp is not None and hasattr(m, "input_layernorm"):  # Llama / Mistral / Qwen
            p = name + "." if name else ""
            groups.append(_Group(f"{p}input_layernorm", "norm", [f"{p}self_attn.{x}_proj" for x in "qkv"]))
            groups.append(_Group(f"{p}post_attention_layernorm", "norm", [f"{p}mlp.gate_proj", f"{p}mlp.up_proj"]))
            groups.append(_Group(f"{p}mlp.up_proj", "linear_rows", [f"{p}mlp.down_proj"]))
            cfg = getattr(attn, "config", None)
            heads = getattr(cfg, "num_attention_heads", None)
            kv = getattr(cfg, "num_key_value_heads", heads)
            head_dim = getattr(attn, "head_dim", None) or (cfg.hidden_size // heads if cfg else 0)
            if heads and kv and head_dim:
                groups.append(_Group(f"{p}self_attn.v_proj", "v_to_o", [f"{p}self_attn.o_proj"],
                                     group=heads // kv, head_dim=head_dim))
    return [g for g in groups if g.producer in mods and all(c in mods for c in g.consumers)]


def _linear(mods: dict, name: str) -> nn.Linear:
    m = mods[name]
    return m.linear if hasattr(m, "linear") and isinstance(m.linear, nn.Linear) else m


def _weight_storage(lin: nn.Linear) -> torch.Tensor:
    """The tensor to scale in place: the raw weight, or the original under a parametrization (a 2:4 mask
    keeps its zeros, since scaling a column or a row maps zero to zero)."""
    from torch.nn.utils import parametrize

    return lin.parametrizations.weight.original if parametrize.is_parametrized(lin, "weight") else lin.weight


@torch.no_grad()
def collect_input_amax(model: nn.Module, names: list[str], batches) -> dict[str, torch.Tensor]:
    """Per-input-channel max |x| of the named Linears over `batches` (model keyword inputs)."""
    mods = dict(model.named_modules())
    amax: dict[str, torch.Tensor] = {}
    hooks = []
    for n in names:
        def hook(_m, args, n=n):
            x = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0).float()
            amax[n] = torch.maximum(amax[n], x) if n in amax else x
        hooks.append(mods[n].register_forward_pre_hook(hook))
    try:
        was = model.training
        model.eval()
        for b in batches:
            model(**b)
        model.train(was)
    finally:
        for h in hooks:
            h.remove()
    return amax


@torch.no_grad()
def smooth_(model: nn.Module, batches, config: SmoothConfig = SmoothConfig()) -> SmoothReport:
    """Apply equivalence scaling in place (call before quantize_). The float function is unchanged."""
    groups = find_groups(model)
    report = SmoothReport(config.alpha)
    if not groups:
        for n, m in model.named_modules():
            if isinstance(m, nn.Linear):
                report.skipped[n] = "no scalable producer recognised (not a Llama-family block)"
        return report
    mods = dict(model.named_modules())
    consumers = [c for g in groups for c in g.consumers]
    amax = collect_input_amax(model, consumers, batches)
    covered = set(consumers)
    for n, m in mods.items():
        if isinstance(m, nn.Linear) and n not in covered and not n.endswith(".linear"):
            report.skipped[n] = "no scalable producer (left as is)"
    for g in groups:
        ws = [_weight_storage(_linear(mods, c)) for c in g.consumers]  # [out, in] each
        x_max = torch.stack([amax[c] for c in g.consumers]).amax(0)  # [in]
        w_max = torch.cat(ws, 0).abs().amax(0).float()  # [in]
        if g.kind == "v_to_o":  # o's input channel (h, d) is produced by kv head h // group
            d, grp = g.head_dim, g.group
            x_max = x_max.reshape(-1, grp, d).amax(1)  # [kv, d]
            w_max = w_max.reshape(-1, grp, d).amax(1)
        s = (x_max.clamp_min(1e-5) ** config.alpha / w_max.clamp_min(1e-5) ** (1 - config.alpha)).clamp(1e-2, 1e3)
        if g.kind == "v_to_o":
            s_in = s.unsqueeze(1).expand(-1, g.group, -1).reshape(-1)  # [H * d]
            s_prod = s.reshape(-1)  # [kv * d]
        else:
            s_in = s_prod = s
        for w in ws:
            w.mul_(s_in.to(w.dtype))
        prod = mods[g.producer]
        if g.kind == "norm":
            prod.weight.div_(s_prod.to(prod.weight.dtype))
            if getattr(prod, "bias", None) is not None:
                prod.bias.div_(s_prod.to(prod.bias.dtype))
        else:
            lin = _linear(mods, g.producer)
            w = _weight_storage(lin)
            w.div_(s_prod.to(w.dtype).unsqueeze(1))
            if lin.bias is not None:
                lin.bias.div_(s_prod.to(lin.bias.dtype))
        report.max_scale = max(report.max_scale, float(s.max()))
        for c in g.consumers:
            report.smoothed[c] = g.producer
    return report


__all__ = ["SmoothConfig", "SmoothReport", "smooth_", "find_groups", "collect_input_amax"]
