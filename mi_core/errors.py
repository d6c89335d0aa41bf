"""Exceptions for bad input a user can fix.

Every error raised on bad input derives from :class:`MiCoreError`; its message is one line that
says what was expected and what to do. The ``mi-core`` CLI prints that line on stderr and exits
non-zero, without a traceback.
"""


class MiCoreError(Exception):
    """Base class: bad input, reported as one clear line."""


class ModelLoadError(MiCoreError):
    """A model or checkpoint cannot be loaded (missing files, unsupported architecture, ...)."""


class DataError(MiCoreError):
    """A data set cannot be found, parsed or used for the requested task."""


class InterventionError(MiCoreError):
    """A mask, ablation or means file does not fit the model it is applied to."""


class ConfigError(MiCoreError):
    """A configuration value or command-line argument is out of range or malformed."""


class ModelInputError(MiCoreError, ValueError):
    """Inputs a model cannot take: ids, mask, token types or labels of mismatched shapes, more
    tokens than the model's context, labels outside its classes. A ``ValueError`` too, as
    PyTorch's own shape errors are."""


class TrainingError(MiCoreError):
    """Training or pruning cannot go on (e.g. the loss became NaN)."""


class OutputError(MiCoreError):
    """A result cannot be written where it was asked to go (permissions, a file in the way)."""


class DamagedFileError(MiCoreError, ValueError):
    """A file mi_core wrote (or reads) is truncated or not what its name says: a crash during a
    write outside mi_core's atomic writes, a full disk, a hand edit. A ``ValueError`` too, so
    code that treats unreadable files as absent keeps doing so."""
