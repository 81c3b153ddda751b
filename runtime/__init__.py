"""edgeattn.runtime: running bundles: backends, the KServe v2 service and the thermal controller."""

if __name__ != "edgeattn.runtime":  # the folder is installed as edgeattn.runtime; a bare import is a mistake
    raise ImportError(f"import this package as 'edgeattn.runtime', not as {__name__!r}")
