"""edgeattn.plugins: TensorRT plugins and kernels for edgeattn::WindowedAttention."""

if __name__ != "edgeattn.plugins":  # the folder is installed as edgeattn.plugins; a bare import is a mistake
    raise ImportError(f"import this package as 'edgeattn.plugins', not as {__name__!r}")
