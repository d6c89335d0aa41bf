"""``mi-core`` flags generated from a job's config dataclass (names, types, defaults, help).

Every flag defaults to "not given" (``argparse.SUPPRESS``): a flag the user leaves out takes the
dataclass default when the config is built, so the command line never restates a default and
cannot drift from the library's. :func:`given_values` returns exactly the flags that were given.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Collection
from typing import Any

from mi_core.config import field_docs, unwrap_optional
from mi_core.errors import ConfigError

__all__ = ["add_config_flags", "flag_name", "given_values", "require"]


def flag_name(f: dataclasses.Field) -> str:
    """The flag of field ``f``: its ``option(flag=...)`` or ``--field-name``."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return ""
    if value is None or value == [] or value == {}:
        return ""
    if isinstance(value, bool):
        return ""
    if isinstance(value, list):
        value = " ".join(str(v) for v in value)
    return f" (default: {value})"


def _cli_fields(cls: type) -> list:
    return [f for f in dataclasses.fields(cls) if f.init and f.metadata.get("cli", True)]


def add_config_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    dest_prefix: str = "",
    overrides: str | None = None,
) -> None:
    """Add one flag per field of config dataclass ``cls`` (but those with ``cli=False``).

    A field without a default is a required flag. ``dest_prefix`` keeps the parsed values apart
    from other configs' (read them back with the same prefix). ``overrides`` makes every flag
    optional and names, in the help, where the values of the flags not given come from (e.g.
    the pruning profile).
    """
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in _cli_fields(cls):
        tp, _ = unwrap_optional(hints[f.name])
        origin = typing.get_origin(tp)
        name = flag_name(f)
        dest = dest_prefix + f.name
        default = f" (default: {overrides})" if overrides else _default_text(f)
        text = (docs.get(f.name, "") + default).replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS, "help": text}
        choices = f.metadata.get("choices")
        parse = f.metadata.get("parse")
        if f.metadata.get("metavar"):
            kwargs["metavar"] = f.metadata["metavar"]
        elif dest_prefix and not choices and tp is not bool:
            kwargs["metavar"] = f.name.upper()
        if tp is bool:
            if f.metadata.get("bool_flag") == "on-off":
                parser.add_argument(name, choices=("on", "off"), **kwargs)
            elif f.default is True:  # the flag switches the field off: say so first
                kwargs["help"] = "Switch off (on by default): " + kwargs["help"]
                parser.add_argument(
                    "--no-" + name.removeprefix("--"), action="store_false", **kwargs
                )
            else:  # --x and --no-x: a config file's true can be switched off on the command line
                parser.add_argument(name, action=argparse.BooleanOptionalAction, **kwargs)
            continue
        if parse is not None:
            kwargs["type"] = str
            if f.metadata.get("repeat"):
                kwargs["action"] = "append"
        elif origin is list:
            (item,) = typing.get_args(tp) or (str,)
            kwargs.update(nargs="+", action="extend", type=item if item in (int, float) else str)
            kwargs.setdefault("metavar", f.name.upper().rstrip("S") or "VALUE")
        elif tp in (int, float, str):
            kwargs["type"] = tp
        else:
            continue  # dicts and nested sections have no flag of their own
        if choices:
            kwargs["choices"] = list(choices)
        is_required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if is_required and overrides is None:
            kwargs["required"] = True
        parser.add_argument(name, **kwargs)


def given_values(
    args: argparse.Namespace,
    cls: type,
    *,
    dest_prefix: str = "",
) -> dict[str, Any]:
    """The fields of ``cls`` whose flags were given, as config values (specs parsed)."""
    values: dict[str, Any] = {}
    for f in _cli_fields(cls):
        dest = dest_prefix + f.name
        if not hasattr(args, dest):
            continue
        value = getattr(args, dest)
        if f.metadata.get("bool_flag") == "on-off":
            value = value == "on"
        parse = f.metadata.get("parse")
        if parse is not None:
            value = parse(value, flag_name(f))
        values[f.name] = value
    return values


def require(values: dict[str, Any], cls: type, names: Collection[str]) -> None:
    """One line naming the flags of ``names`` that neither the command line nor a file gave."""
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    missing = [flag_name(by_name[n]) for n in names if values.get(n) in (None, "")]
    if missing:
        raise ConfigError(f"missing {', '.join(missing)} (as flags or in --config)")
