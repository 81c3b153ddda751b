"""Decoders for generation: rotary causal LMs (the families in edgeattn.decoder.families) with a sinks + ring KV
cache whose window is a run-time input, exported to ONNX with `edgeattn::CachedWindowedAttention`
(docs/generation.md)."""
