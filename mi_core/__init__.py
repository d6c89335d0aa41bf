"""mi_core: subnetwork analysis and separability of capabilities on TransformerLens."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_model"]


def __getattr__(name: str) -> Any:
    # Imported lazily: importing transformer_lens takes seconds, and the CLI should fail fast.
    if name == "load_model":
        from mi_core.models import load_model

        return load_model
    raise AttributeError(f"module 'mi_core' has no attribute {name!r}")
