"""edgeattn.quantize: quantization-aware training (INT8, INT4, FP8) and 2:4 sparsity."""

if __name__ != "edgeattn.quantize":  # the folder is installed as edgeattn.quantize; a bare import is a mistake
    raise ImportError(f"import this package as 'edgeattn.quantize', not as {__name__!r}")
