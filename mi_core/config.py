"""One shape for every job's configuration: a dataclass whose fields and field docs are the source.

Each job (fine-tuning, means, a pruning run, a sweep, effective size, an ablation table, the
heuristic-core experiment, a separability run) has one config dataclass that mixes in
:class:`Config`. Its fields carry the names, types and defaults, the string literal under a field
is its documentation, and :func:`option` adds what a command line needs beyond that (a flag name
kept for old scripts, the allowed values, a parser for spec strings like ``"1-12"``). From that
one source:

- ``Config.validate`` is the single validation hook, run on construction (``__post_init__``);
- ``to_dict`` / ``from_dict`` round-trip through JSON, with one-line :class:`ConfigError` messages
  that name the bad key (unknown keys, missing keys, wrong types, values not among the choices);
- :mod:`mi_core.cli.flags` generates the ``mi-core`` flags, so a new option is one field.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import math
import operator
import os
import re
import textwrap
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mi_core.errors import ConfigError

__all__ = ["Config", "build", "field_docs", "option"]

C = TypeVar("C", bound="Config")


def option(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    flag: str | None = None,
    choices: Sequence[Any] | None = None,
    parse: Callable[[Any, str], Any] | None = None,
    metavar: str | None = None,
    cli: bool = True,
    bool_flag: str | None = None,
    repeat: bool = False,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> Any:
    """A config field with command-line details (its help is the docstring under the field).

    ``flag``: the flag's name when it is not ``--field-name`` (kept for scripts that use it);
    ``choices``: the allowed values (checked in :func:`build` and by the flag); ``parse``: turns a
    spec (``"1-12"``, ``"0.05:0.7:0.05"``) into the value, called as ``parse(value, where)``;
    ``cli=False``: no flag; ``bool_flag``: ``"on-off"`` for ``--x on|off`` instead of
    ``--x`` / ``--no-x``; ``repeat``: the flag may be given several times, and ``parse``
    receives the list of its values. ``gt`` / ``ge`` / ``lt`` / ``le``: bounds of a number,
    checked by :meth:`Config.validate` (with the value's type and, for a float, finiteness).
    """
    metadata = {
        "flag": flag,
        "choices": tuple(choices) if choices is not None else None,
        "parse": parse,
        "metavar": metavar,
        "cli": cli,
        "bool_flag": bool_flag,
        "repeat": repeat,
        "bounds": {
            k: v for k, v in (("gt", gt), ("ge", ge), ("lt", lt), ("le", le)) if v is not None
        },
    }
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def _plain(doc: str) -> str:
    """A docstring as one plain line: ``x`` and :func:`~a.b.x` become x."""
    text = re.sub(r":[a-z]+:`~?([^`]*)`", lambda m: m.group(1).rsplit(".", 1)[-1], doc)
    return " ".join(text.replace("``", "").split())


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (and of its bases), one line each."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # pragma: no cover - classes built at run time
            continue
        body = ast.parse(source).body[0]
        statements = getattr(body, "body", [])
        for node, after in zip(statements, statements[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = _plain(after.value.value)
    return docs


class Config:
    """Mixin for a job's config dataclass: validated on construction, JSON round-trip."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` (one line, naming the field) for a bad value: one outside
        its field's ``choices`` or bounds (:func:`option`), a field annotated ``int`` /
        ``float`` / ``bool`` (or bounded) holding another type, or a float that is not finite
        (a float field given an int keeps a float). A subclass calls this, then checks what
        spans fields."""
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            given = value if isinstance(value, list | tuple) else [value]  # a list: each item
            if choices and value is not None and any(v not in choices for v in given):
                raise ConfigError(f"{f.name} must be one of {list(choices)}, got {value!r}")
            bounds = f.metadata.get("bounds") or {}
            if f.type in ("int", "float", int, float) or (bounds and value is not None):
                number = check_bounded(f.name, value, f.type, bounds)
                if number is not value:
                    object.__setattr__(self, f.name, number)
            elif f.type in ("bool", bool) and not isinstance(value, bool):
                raise ConfigError(f"{f.name} must be true or false, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict that :meth:`from_dict` reads back into an equal config."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[C], data: Any, source: str = "config") -> C:
        """Validate ``data`` (parsed JSON) into a config; :class:`ConfigError` names a bad key."""
        return build(cls, data, "", source)

    def to_json(self, path: str | os.PathLike[str]) -> Path:
        """Write the config as JSON (atomically)."""
        from mi_core.io import write_json

        return write_json(path, self.to_dict())

    @classmethod
    def from_json(cls: type[C], path: str | os.PathLike[str]) -> C:
        """Read a config written by :meth:`to_json` (or by hand)."""
        path = Path(path)
        return cls.from_dict(read_config_json(path), source=path.name)

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


def _bound_text(bounds: dict[str, float]) -> str:
    """``bounds`` as words: "positive", "non-negative", "strictly between 0 and 1", ..."""
    gt, ge, lt, le = (bounds.get(k) for k in ("gt", "ge", "lt", "le"))
    if gt is not None and lt is not None:
        return f"lie strictly between {gt:g} and {lt:g}"
    low = f"[{ge:g}" if ge is not None else (f"({gt:g}" if gt is not None else None)
    high = f"{lt:g})" if lt is not None else (f"{le:g}]" if le is not None else None)
    if low is not None and high is not None:
        return f"lie in {low}, {high}"
    if gt == 0:
        return "be positive"
    if ge == 0:
        return "be non-negative"
    if low is not None:
        return f"be at least {ge:g}" if ge is not None else f"be greater than {gt:g}"
    return f"be below {lt:g}" if lt is not None else f"be at most {le:g}"


def check_bounded(name: str, value: Any, annotation: Any, bounds: dict[str, float]) -> Any:
    """``value`` checked as the number its field declares (``int`` or ``float``, finite) and
    against ``bounds``; a float field gets a float back."""
    integer = annotation in ("int", int, "int | None", "Optional[int]")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{name} must be {kind}, got {value!r}")
    if integer and not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be finite, got {value!r}")
    ok = all(
        (k != "gt" or value > v) and (k != "ge" or value >= v) and (k != "lt" or value < v)
        and (k != "le" or value <= v)
        for k, v in bounds.items()
    )  # fmt: skip
    if not ok:
        raise ConfigError(f"{name} must {_bound_text(bounds)}, got {value}")
    return value if integer or isinstance(value, float) else float(value)


# ----------------------------------------------------------------------- config files
def read_config_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in config file ``path``; :class:`ConfigError` (one line) if it cannot be
    read, is not JSON or is not an object."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text; save the config as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path.name}: a config is a JSON object")
    return data


def shipped_names(folder: str) -> list[str]:
    """Names of the configs shipped in ``mi_core/<folder>/*.json`` (e.g. ``configs``)."""
    from importlib import resources

    root = resources.files("mi_core") / folder
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(p.name[: -len(".json")] for p in entries if p.name.endswith(".json"))


def resolve_shipped(
    folder: str, name_or_path: str | os.PathLike[str], what: str = "config"
) -> Path:
    """A config file: ``name_or_path`` if it is a file, else the config of that name shipped in
    ``mi_core/<folder>`` (``.json`` optional); :class:`ConfigError` listing them otherwise."""
    from importlib import resources

    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    name = os.fspath(name_or_path).removesuffix(".json")
    names = shipped_names(folder)
    if name in names:
        return Path(str(resources.files("mi_core") / folder / f"{name}.json"))
    raise ConfigError(
        f"no config file or shipped {what} named {os.fspath(name_or_path)!r}; shipped {what}s: "
        f"{', '.join(names) or '(none)'}"
    )


# ------------------------------------------------------------------------------ building
def _json(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """``(inner type, allows None)`` of an annotation."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return inner[0], type(None) in args
        return functools.reduce(operator.or_, inner), type(None) in args
    return tp, False


def check_value(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (str, int, float, bool, list, dict, Any, a
    or an Optional of one); return it (ints widened to float where a float is
    expected)."""
    inner, nullable = unwrap_optional(tp)
    if value is None and nullable:
        return None
    tp = inner
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is list or tp is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, got {_json(value)}")
        (item,) = typing.get_args(tp) or (Any,)
        return [check_value(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be an object, got {_json(value)}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {_json(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {_json(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {_json(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {_json(value)}")
        return value
    if origin in (typing.Union, types.UnionType):  # e.g. str | list[str]: the first that fits
        for option_type in typing.get_args(tp):
            try:
                return check_value(value, option_type, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where} has the wrong type: {_json(value)}")
    raise ConfigError(f"{where}: cannot check a value of type {tp}")  # pragma: no cover


def build(cls: type[C], data: Any, prefix: str = "", source: str = "config") -> C:
    """Build dataclass ``cls`` from ``data``, checking keys and types (nested sections by their
    annotation); ``prefix`` names the section in messages, ``source`` the file."""
    label = f"{source}: " if source else ""
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(data, dict):
        raise ConfigError(f"{label}{where} must be a JSON object, got {_json(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{label}unknown key(s) {unknown} in {where}; valid keys: {sorted(fields)}"
        )
    missing = [
        name
        for name, f in fields.items()
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and name not in data
    ]
    if missing:
        raise ConfigError(f"{label}missing required key(s) {missing} in {where}")
    values: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{label}{prefix}{name}"
        parse = fields[name].metadata.get("parse")
        section, nullable = unwrap_optional(hints[name])
        if dataclasses.is_dataclass(section):  # a nested section; null means its defaults
            if value is None and nullable:
                values[name] = None
            else:
                values[name] = build(
                    section, {} if value is None else value, f"{prefix}{name}.", source
                )
        elif parse is not None and value is not None:
            values[name] = parse(value, key)
        else:
            values[name] = check_value(value, hints[name], key)
    try:
        return cls(**values)
    except ConfigError as exc:
        if prefix and not str(exc).startswith(prefix):
            raise ConfigError(f"{label}{prefix}{exc}") from None
        raise
