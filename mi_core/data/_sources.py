"""Where data comes from: the offline data directory, or the Hugging Face hub for users online.

Resolution order for every loader:

1. the data directory: the ``data_dir=`` argument, else the ``MI_CORE_DATA_DIR`` environment
   variable. Its layout is that of the project's shared data (``{task}/{split}.jsonl`` for the GLUE
   tasks, ``hans/heuristics_evaluation_set.txt``, ``paws_qqp/dev_and_test.tsv``, ``text/...``).
2. the hub through ``datasets.load_dataset``, only when the file is not in the data directory,
   the data set has a hub copy, ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE`` are not set, and the
   hub host answers a single quick connection probe.

Everything else fails at once with a one-line :class:`~mi_core.errors.DataError` that names the
file looked for and how to get it; there is never a retry loop.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mi_core.errors import DataError

#: The environment variable naming the folder local data sets are read from.
DATA_DIR_ENV = "MI_CORE_DATA_DIR"
_TRUE = {"1", "true", "yes", "on"}


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The data directory to read: ``data_dir`` if given, else ``$MI_CORE_DATA_DIR``, else None."""
    if data_dir is None:
        env = os.environ.get(DATA_DIR_ENV, "").strip()
        if not env:
            return None
        data_dir, origin = env, f"{DATA_DIR_ENV}={env}"
    else:
        origin = f"data_dir={os.fspath(data_dir)}"
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise DataError(f"data directory {path} ({origin}) does not exist or is not a directory")
    return path


def hub_offline() -> bool:
    """True when the hub must not be called (``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE``)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUE:
            return True
    return False


def _hub_reachable(timeout: float = 3.0) -> bool:
    """One quick TCP probe of the hub host (skipped, i.e. assumed reachable, behind a proxy)."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    host = parsed.hostname or "huggingface.co"
    port = parsed.port or (80 if parsed.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def local_file(spec: str, rel_path: str, data_dir: Path | None) -> Path | None:
    """``data_dir/rel_path`` if it exists, else None."""
    if data_dir is None:
        return None
    path = data_dir / rel_path
    return path if path.is_file() else None


def _where(rel_path: str, data_dir: Path | None) -> str:
    if data_dir is None:
        return (
            f"no data directory is set ({DATA_DIR_ENV} unset, no data_dir=), so {rel_path} "
            f"could not be looked for"
        )
    return f"{data_dir / rel_path} does not exist"


def missing_error(
    spec: str, rel_path: str, data_dir: Path | None, how: str, reason: str, *, fetch: bool = False
) -> DataError:
    """The one-line error for data that is neither local nor loadable from the hub. With
    ``fetch`` (``mi-core data fetch``), ``how`` names the fetch's own folder, the one place."""
    if fetch:
        return DataError(f"{spec}: {_where(rel_path, data_dir)}, and {reason}; to get it: run "
                         f"with the hub reachable (HF_HUB_OFFLINE unset), or {how}")  # fmt: skip
    return DataError(
        f"{spec}: {_where(rel_path, data_dir)}, and {reason}; to get it: {how}, or place the file "
        f"at {DATA_DIR_ENV}/{rel_path} (set {DATA_DIR_ENV} or pass data_dir=)"
    )


HANS_FILE = "hans/heuristics_evaluation_set.txt"
PAWS_FILE = "paws_qqp/dev_and_test.tsv"
#: The official release's training split; the paper evaluates on train + dev_and_test.
PAWS_TRAIN_FILE = "paws_qqp/train.tsv"


def hub_rows(ds: Any) -> list[dict[str, Any]]:
    """The rows of a hub data set (``datasets.Dataset``) as dicts."""
    cols = ds.to_dict()
    keys = list(cols)
    n = len(cols[keys[0]]) if keys else 0
    return [{k: cols[k][i] for k in keys} for i in range(n)]


def hub_load(
    spec: str,
    rel_path: str,
    data_dir: Path | None,
    hub_args: tuple[Any, ...],
    hub_kwargs: dict[str, Any],
    how: str,
    *,
    fetch: bool = False,
) -> Any:
    """``datasets.load_dataset(*hub_args, **hub_kwargs)``, or an immediate :class:`DataError`
    (``fetch``: see :func:`missing_error`)."""
    hub_name = " ".join(str(a) for a in hub_args)
    if hub_offline():
        raise missing_error(
            spec,
            rel_path,
            data_dir,
            how,
            f"the hub ({hub_name}) is not called because HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set",
            fetch=fetch,
        )
    if not _hub_reachable():
        raise missing_error(
            spec,
            rel_path,
            data_dir,
            how,
            f"the Hugging Face hub ({hub_name}) cannot be reached",
            fetch=fetch,
        )
    try:
        import datasets

        return datasets.load_dataset(*hub_args, **hub_kwargs)
    except Exception as exc:  # noqa: BLE001 - any hub failure becomes one clear line
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise missing_error(
            spec,
            rel_path,
            data_dir,
            how,
            f"loading it from the hub ({hub_name}) failed ({detail})",
            fetch=fetch,
        ) from exc


def read_json_rows(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file, or of a ``.json`` file holding one array of them (a
    byte-order mark is dropped); each malformed line is one :class:`DataError`."""
    return [row for _, row in located_json_rows(path)]


def located_json_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """:func:`read_json_rows` with where each object is, for errors about its fields:
    ``path:line`` in a JSON-lines file, ``path: row i`` in an array."""
    text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (Excel, Notepad) is dropped
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON ({exc})") from None
        if not all(isinstance(r, dict) for r in rows):
            raise DataError(f"{path}: expected a JSON list of objects")
        return [(f"{path}: row {i}", row) for i, row in enumerate(rows, 1)]
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: not a valid JSON line ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object per line")
        rows.append((f"{path}:{lineno}", row))
    return rows
