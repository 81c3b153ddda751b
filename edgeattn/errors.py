"""The one hierarchy of user-facing errors.

Messages say what was expected and what was found. The CLI prints `str(error)` as one line and exits
with `exit_code`; anything that is not an EdgeAttnError is a bug and keeps its traceback.
"""


class EdgeAttnError(Exception):
    """Base of every error a user can cause or fix."""

    exit_code = 1


class InputError(EdgeAttnError):
    """A file, argument or tensor given by the user is not what was expected."""

    exit_code = 2


class ModelError(InputError):
    """An ONNX model or checkpoint is missing, unreadable or unsupported."""


class ConfigError(InputError):
    """A configuration value is invalid."""


class TargetError(InputError):
    """A target is unknown, or lacks a requested feature (precision, plugin, sparsity)."""


class BundleError(EdgeAttnError):
    """A bundle is missing, incomplete or does not match its manifest."""

    exit_code = 3


class BuildError(EdgeAttnError):
    """A build step failed (graph pass, engine builder, parity check)."""

    exit_code = 4


class StrictModeError(BuildError):
    """`--strict` was given and a requested precision or fusion did not happen."""


class MissingDependencyError(EdgeAttnError):
    """An optional dependency is needed for this step and is not installed."""

    exit_code = 5


class RuntimeBackendError(EdgeAttnError):
    """A runtime backend could not load or run a bundle."""

    exit_code = 6


class FidelityError(EdgeAttnError):
    """A lossy stage (quantize, sparsify) ended below the fidelity floor its config set."""

    exit_code = 7


class EdgeAttnWarning(UserWarning):
    """Something the user should hear that does not stop the work (the CLI shows these; others' only with -v)."""
