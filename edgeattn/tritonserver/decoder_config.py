"""config.pbtxt for decoder bundles: a decoupled Python-backend model, text in and streamed text out.

The tensor names follow Triton's generate extension and its LLM backends (`text_input`, `max_tokens`,
`text_output`), so `/v2/models/{name}/generate_stream` takes `{"text_input": "...", "max_tokens": 16}`."""

from __future__ import annotations

# (name, Triton type, dims); every input but text_input is optional
DECODER_INPUTS = (("text_input", "TYPE_STRING", 1), ("max_tokens", "TYPE_INT32", 1),
                  ("temperature", "TYPE_FP32", 1), ("top_p", "TYPE_FP32", 1), ("top_k", "TYPE_INT32", 1),
                  ("seed", "TYPE_INT64", 1), ("window", "TYPE_INT32", 1), ("attention_budget", "TYPE_INT32", 1),
                  ("stop", "TYPE_STRING", -1))
DECODER_OUTPUTS = (("text_output", "TYPE_STRING", 1), ("token_ids", "TYPE_INT64", -1), ("window", "TYPE_INT32", 1),
                   ("attention_budget", "TYPE_INT32", 1), ("finish_reason", "TYPE_STRING", 1))


def _tensor(key: str, name: str, dtype: str, dims: int, optional: bool) -> list[str]:
    lines = [f"{key} {{", f'    name: "{name}"', f"    data_type: {dtype}", f"    dims: [ {dims} ]"]
    if optional:
        lines.append("    optional: true")
    return lines + ["}"]


def render_decoder_config(manifest, name: str, instances: int, kind: str, gpus: tuple[int, ...] = ()) -> list[str]:
    """The config lines after the header comments: no batching (an instance streams one request at a time).
    `gpus`: the GPUs of KIND_GPU instances (`instances` on each; none: every GPU the server sees)."""
    decoder = manifest.sections["decoder"]
    lines = [f"# decoder: sinks {decoder['sinks']}, ring of {decoder['window_max']} rows; one request at a time "
             "per instance", f'name: "{name}"', 'backend: "python"', "max_batch_size: 0",
             "model_transaction_policy { decoupled: true }"]
    for tensor_name, dtype, dims in DECODER_INPUTS:
        lines += _tensor("input", tensor_name, dtype, dims, optional=tensor_name != "text_input")
    for tensor_name, dtype, dims in DECODER_OUTPUTS:
        lines += _tensor("output", tensor_name, dtype, dims, optional=False)
    where = [f"  gpus: [ {', '.join(map(str, gpus))} ]"] if gpus else []
    return lines + ["instance_group {", f"  count: {instances}", f"  kind: {kind}", *where, "}"]
