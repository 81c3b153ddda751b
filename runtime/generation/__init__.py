"""Text generation from decoder bundles: a sinks + ring KV cache whose window changes at run time, chunked
prefill, sampling, stop strings, chat templates and UTF-8-safe streaming (docs/generation.md)."""
