"""Text generation from decoder bundles: a sinks + ring KV cache whose window changes at run time, chunked
prefill, sampling, stop strings, chat templates and UTF-8-safe streaming (docs/generation.md).

One decode engine (`engine.py`) runs every request, whoever asks: `Generator` (generator.py) drives it with one
slot, the server's scheduler (edgeattn.runtime.server.scheduler) with many. It drives any `DecoderBackend`
(backend.py): `DecoderModel` (decoder_bundle.py) or `TorchDecoderModel` (torch_decoder.py)."""
