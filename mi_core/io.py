"""Atomic file output: results appear whole or not at all, never half-written.

Every writer goes through :func:`atomic_path`, which yields a temporary file in the target's own
directory and renames it over the target only once writing succeeded.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mi_core.errors import DamagedFileError, OutputError

if TYPE_CHECKING:  # torch is imported where tensors are written: the CLI's help needs none
    import torch

#: Suffixes that make an output path a file (anything else is a folder of results).
FILE_SUFFIXES = (".csv", ".json", ".jsonl", ".md", ".html", ".safetensors", ".txt")


def _planted_link(link: Path) -> bool:
    """Whether ``link`` is a symbolic link that another user planted in a sticky,
    world-writable folder: owned neither by this user nor by the folder's owner. Writing
    through it would replace a file of that user's choosing (the case the kernel's
    ``fs.protected_symlinks`` refuses; mi_core resolves links itself, so it checks too)."""
    try:
        owner = link.lstat().st_uid
        folder = link.parent.stat()
    except OSError:
        return False
    shared = folder.st_mode & stat.S_ISVTX and folder.st_mode & stat.S_IWOTH
    return bool(shared) and owner not in (os.getuid(), folder.st_uid)


def _file_target(path: str | os.PathLike[str]) -> tuple[Path, str | None]:
    """The file a write to ``path`` replaces (a link is written through), and why it must not
    be replaced (None: it may): a device or a FIFO, or a file kept read-only on purpose. Both
    the check before any work (:func:`ensure_writable`) and every write (:func:`atomic_path`)
    ask here."""
    target = Path(path)
    if target.is_symlink() and _planted_link(target):
        return target, (
            "it is a symbolic link another user owns in a shared sticky folder (as /tmp is), "
            "which the kernel's protected_symlinks would not follow: remove it or write elsewhere"
        )
    if target.is_symlink():
        try:
            target = target.resolve()
        except RuntimeError:  # Python's word for a link that leads back to itself
            return target, "it is a symbolic link that leads back to itself (a loop)"
    if target.exists() and not target.is_file() and not target.is_dir():
        return target, "it is not a regular file (a device or a FIFO is never replaced)"
    if target.is_file() and not target.stat().st_mode & 0o222:
        return target, "the file is read-only (make it writable to replace it)"
    if target.is_file():  # the mode bits do not tell an immutable file (chattr +i): ask it
        try:
            os.close(os.open(target, os.O_WRONLY | os.O_APPEND))
        except OSError as exc:
            return target, f"the file cannot be written ({exc.strerror}; immutable?)"
    return target, None


def ensure_writable(path: str | os.PathLike[str], kind: str = "auto") -> Path:
    """Check, before any work starts, that results can be written at ``path``: a ``"file"``,
    a ``"folder"``, or (``"auto"``) a file for a name with a known file suffix and a folder
    otherwise. Nothing is created. Raises :class:`~mi_core.errors.OutputError` with one line
    saying why not."""
    if kind not in ("auto", "file", "folder"):
        raise ValueError(f"kind must be auto, file or folder, not {kind!r}")
    target, reason = _file_target(Path(path).expanduser())
    is_file = kind == "file" or (kind == "auto" and target.suffix.lower() in FILE_SUFFIXES)

    def refuse(reason: str) -> OutputError:
        return OutputError(f"cannot write results to {target}: {reason}")

    if reason is not None and target.is_symlink():  # a loop: neither a file nor a folder
        raise refuse(reason)

    if target.exists():
        if is_file and target.is_dir():
            raise refuse("a folder is in the way of the output file")
        if not is_file and not target.is_dir():
            raise refuse("a file is in the way of the output folder")
        if reason is not None:
            raise refuse(reason)
        if not os.access(target if target.is_dir() else target.parent, os.W_OK | os.X_OK):
            raise refuse("Permission denied")
        return target
    ancestor = target.parent
    while not ancestor.exists():
        if ancestor.is_symlink():  # exists() is False through a loop or a missing target
            raise refuse(
                f"{ancestor} is a symbolic link that leads nowhere (a loop, or to nothing)"
            )
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise refuse(f"Not a directory ({ancestor} is a file)")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise refuse(f"Permission denied (in {ancestor})")
    return target


def check_replaceable(folder: str | os.PathLike[str], names: Iterable[str]) -> None:
    """Check, before any work starts, that a job may replace each of ``names`` (paths relative
    to ``folder``) that exists: not read-only, not a device, FIFO or folder, in a writable
    folder. Otherwise a read-only file among a job's outputs is found only when the job writes
    it, after the work, with some outputs replaced and others not. Raises
    :class:`OutputError`."""
    for name in names:
        target, reason = _file_target(Path(folder).expanduser() / name)
        if reason is None and target.is_dir():
            reason = "a folder is in the way of this file"
        if reason is None and target.parent.is_dir():
            if not os.access(target.parent, os.W_OK | os.X_OK):
                reason = "Permission denied"
        if reason is not None:
            raise OutputError(f"cannot write results to {target}: {reason}")


def _lock_folder() -> Path:
    """This user's own folder for output locks, ``<tmp>/mi_core-locks-<uid>``, mode 0700.

    A folder shared by every user (as ``/tmp`` is) would let another local user plant a link
    where a lock is opened, and so make a run write into any file its user can write. A folder
    there that is not a real directory of this user's is refused, not used."""
    folder = Path(tempfile.gettempdir()) / f"mi_core-locks-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise OutputError(
            f"the lock folder {folder} is not a folder of this user's (a link, a file or another "
            "user's folder is there): remove it, or set TMPDIR to a folder of your own"
        )
    if info.st_mode & 0o077:
        folder.chmod(0o700)
    return folder


@contextlib.contextmanager
def output_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the one lock on an output folder for a ``with`` block: a second run writing to the
    same folder at once gets :class:`~mi_core.errors.OutputError` instead of corrupting it.

    The lock is a file in this user's private lock folder (:func:`_lock_folder`), named by a
    hash of the output's absolute path, so nothing is created in the user's folders before the
    work starts; it covers this user's runs on one machine. It is opened without following a
    link and only ever written through its own descriptor."""
    import fcntl
    import hashlib

    try:
        target = Path(path).expanduser().resolve()
    except (OSError, RuntimeError):  # RuntimeError: Python's word for a link loop
        raise OutputError(
            f"cannot write results to {path}: its path leads through a symbolic link loop"
        ) from None
    name = hashlib.sha256(str(target).encode()).hexdigest()[:24]
    lock = _lock_folder() / f"{name}.lock"
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(lock, flags, 0o600)
    except OSError as exc:  # ELOOP: a link where the lock should be
        raise OutputError(f"cannot open the output lock {lock}: {exc.strerror}") from None
    with os.fdopen(fd, "r+", encoding="utf-8") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OutputError(f"the output lock {lock} is not a regular file; remove it")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = handle.read(64).strip() or "?"
            raise OutputError(
                f"another mi-core run ({owner}) is writing to {target}; wait for it to finish "
                "or use another --out"
            ) from None
        handle.truncate(0)
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def user_umask() -> int:
    """The process's umask (read without changing it for longer than a call)."""
    return _umask()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it to ``path``.

    The file ends with the mode a plain ``open(path, "w")`` would give it (0666 less the user's
    umask), not the 0600 of a temporary file, so collaborators can read shared results.
    """
    target, reason = _file_target(path)
    if reason is not None:
        raise OutputError(f"cannot write {target}: {reason}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(fd)
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except OSError as exc:  # name the file the user asked for, not the hidden temporary one
        hidden = os.path.abspath(target.parent / f".{target.name}.")
        ours = exc.filename is None or os.path.abspath(str(exc.filename)).startswith(hidden)
        if not ours:
            raise
        raise type(exc)(exc.errno, exc.strerror or str(exc), str(target)) from exc
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented, strict JSON atomically: a NaN or infinite number (which
    Python's json would write as a bare ``NaN`` that other parsers reject) is written as null."""
    text = json.dumps(_finite(obj), indent=2, sort_keys=False, allow_nan=False)
    return write_text(path, text + "\n")


def _finite(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (containers copied as needed)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


#: What to do with a damaged file a job wrote: remove it alone. The job remakes what it can
#: (a cache, a record, a finished run's metrics from its last checkpoint) and starts over only
#: the piece that file was (a run's checkpoint); removing the whole run folder would throw
#: away the rest.
_REMOVE_ONE = "remove that one file and run the job that wrote it again, which remakes it"


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file; a damaged one raises :class:`~mi_core.errors.DamagedFileError` naming
    it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
        raise DamagedFileError(
            f"{path} is damaged ({reason}): a partly written or edited file; restore it, or, if "
            f"a mi-core job wrote it, {_REMOVE_ONE}"
        ) from None


def write_csv(path: str | os.PathLike[str], frame: Any) -> Path:
    """Write a pandas DataFrame as CSV (no index) atomically."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
    return Path(path)


def write_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Save tensors (made contiguous) as safetensors atomically, with string metadata."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        try:
            save_file(
                {k: v.detach().contiguous().cpu() for k, v in tensors.items()},
                str(tmp),
                metadata=dict(metadata) if metadata else None,
            )
        except SafetensorError as exc:  # e.g. no space left: the OSError it wraps
            raise OutputError(f"cannot write {path}: {exc}") from None
    return Path(path)


def read_safetensors(
    path: str | os.PathLike[str],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Load a safetensors file: its tensors and its metadata."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    if not os.access(path, os.R_OK) and os.path.exists(path):
        raise PermissionError(13, "Permission denied", str(path))
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = dict(handle.metadata() or {})
        return load_file(str(path)), metadata
    except SafetensorError as exc:
        raise DamagedFileError(
            f"{path} is damaged ({exc}): a partly written file; restore it, or, if a mi-core "
            f"job wrote it, {_REMOVE_ONE}"
        ) from None
