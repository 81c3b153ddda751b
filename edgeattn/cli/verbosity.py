"""What the CLI prints of other libraries: nothing by default, their warnings and logs with `-v`.

Third-party warnings (the torch exporter's, transformers' progress bars) are noise for a user who asked
for an export or a build; edgeattn's own problems reach the user as output lines and errors, not as
Python warnings. `-v` shows everything, as the libraries would.
"""

from __future__ import annotations

import logging
import os
import warnings

_QUIET_ENV = {
    "TORCH_LOGS": "-all",  # torch's own loggers (exporter registration lines) at ERROR
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # also turns off transformers' weight-loading bar
    "TF_CPP_MIN_LOG_LEVEL": "3",
}


def configure(verbose: int) -> None:
    """verbose 0: third-party warnings and logs hidden; 1: shown; 2: also edgeattn's debug logs."""
    if verbose:
        logging.basicConfig(level=logging.DEBUG if verbose > 1 else logging.INFO,
                            format="%(levelname)s %(name)s: %(message)s")
        return
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)  # a value the user set wins
    from edgeattn.errors import EdgeAttnWarning

    warnings.filterwarnings("ignore")  # torch's warnings point at our call sites, so filter by category
    warnings.filterwarnings("default", category=EdgeAttnWarning)
    logging.getLogger("onnxscript").setLevel(logging.ERROR)
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)
