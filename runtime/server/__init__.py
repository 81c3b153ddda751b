"""The KServe v2 (Open Inference Protocol) service: HTTP app, JSON/binary codec, dynamic batcher, metrics."""
