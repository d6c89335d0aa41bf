"""Lazy package exports: ``from mi_core.pruning import prune`` imports ``mi_core.pruning.run``
when the name is first used, not when the package is.

A package ``__init__`` lists where each public name lives and hands the table to
:func:`lazy_exports`; importing the package (and a light module of it, such as a job's config)
then costs nothing, so ``mi-core <command> --help`` answers without importing torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


class _LazyPackage(types.ModuleType):
    """A package whose exported names win over its submodules of the same name.

    ``mi_core.pruning.reference_logits`` is both a function and the module defining it; the
    import system sets the module as the package's attribute when the module is imported,
    which would hide the function. As with eager imports, the exported name wins.
    """

    _lazy_names: Mapping[str, str]

    def __setattr__(self, name: str, value: Any) -> None:
        if (
            isinstance(value, types.ModuleType)
            and name in self.__dict__.get("_lazy_names", {})
            and value.__name__ == f"{self.__name__}.{name}"
        ):
            return
        super().__setattr__(name, value)


def lazy_exports(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps each public name to the
    module (absolute) that defines it; a submodule's name imports the submodule."""

    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
        else:
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        setattr(importlib.import_module(package), name, value)  # resolved once
        return value

    def __dir__() -> list[str]:
        return sorted(set(names) | set(sys.modules[package].__dict__))

    module = sys.modules[package]
    module.__class__ = _LazyPackage
    module.__dict__["_lazy_names"] = names
    return __getattr__, __dir__
