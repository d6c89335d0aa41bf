"""The registry of intervention kinds: the ``kind`` in a saved file's metadata -> its reader.

Each kind registers itself where it is defined::

    register_kind(SUBNETWORK_KIND, Subnetwork.load)

and :func:`~mi_core.interventions.base.load_intervention` reads any registered kind back.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from mi_core.errors import InterventionError
from mi_core.io import read_safetensors

__all__ = ["Loader", "kind_loader", "read_kind", "register_kind"]

#: Reads a saved intervention back from its file.
Loader = Callable[[str | os.PathLike[str]], Any]

_LOADERS: dict[str, Loader] = {}


def register_kind(kind: str, load: Loader) -> None:
    """Make :func:`~mi_core.interventions.base.load_intervention` read files of ``kind`` with
    ``load``. A kind belongs to one loader: registering it again with another is refused."""
    if _LOADERS.get(kind, load) != load:
        raise InterventionError(
            f"intervention kind {kind!r} is already registered (to {_LOADERS[kind]!r}); give the "
            "new kind a name of its own"
        )
    _LOADERS[kind] = load


def kind_loader(kind: str | None) -> Loader | None:
    """The loader registered for ``kind``, or None."""
    return None if kind is None else _LOADERS.get(kind)


def read_kind(
    path: str | os.PathLike[str], kind: str, what: str, format_version: str, hint: str = ""
) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensors and metadata of the ``what`` file (``"edge mask"``) at ``path``, refused with
    one line when it is missing, of another kind (``hint`` says where such a file is read) or of
    another ``format_version``."""
    try:
        tensors, metadata = read_safetensors(path)
    except FileNotFoundError:
        raise InterventionError(f"no {what} file at {path}") from None
    if metadata.get("kind") != kind:
        raise InterventionError(f"{path} is not a {what} (kind {metadata.get('kind')!r}){hint}")
    if metadata.get("format_version") != format_version:
        raise InterventionError(
            f"{path}: {what.replace(' ', '-')} format {metadata.get('format_version')!r} is not "
            f"{format_version!r}; upgrade mi_core"
        )
    return tensors, metadata
