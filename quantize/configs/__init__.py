"""Quantization configs, one file each: every module here is imported with `edgeattn.quantize.config`, and
each registers its config (`@register_config` from `edgeattn.quantize.registry`), so a new file is a new
`edgeattn quantize --config` choice.

w8a8 and w4 live in `edgeattn.quantize.registry` itself; fp8.py here is the example of a config in one file."""
