"""Decoders for generation: Llama-family causal LMs with a sinks + ring KV cache whose window is a run-time
input, exported to ONNX with `edgeattn::CachedWindowedAttention` (docs/generation.md)."""
