"""Shared fixtures: the offline environment, tiny checkpoints and the real MiniLM."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data directory (``MI_CORE_DATA_DIR``, else ``../shared/data``)."""
    from helpers import REAL_DATA_DIR as path

    if not path.is_dir():
        pytest.fail(f"data directory {path} not found; set MI_CORE_DATA_DIR")
    os.environ["MI_CORE_DATA_DIR"] = str(path)
    return path


class _TinyCheckpoints(dict):
    """Tiny checkpoint folders by kind, each written the first time a test asks for it."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = root

    def __missing__(self, kind: str) -> Path:
        from mi_core.testing import make_tiny_checkpoint

        self[kind] = path = make_tiny_checkpoint(kind, self.root / kind)
        return path


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    """One tiny random Hugging Face checkpoint directory per kind of
    :data:`mi_core.testing.TINY_KINDS` (made when first used)."""
    return _TinyCheckpoints(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def lm_path(tiny_checkpoints):
    """The tiny random Llama causal LM's checkpoint folder."""
    return tiny_checkpoints["llama-lm"]


@pytest.fixture(scope="module")
def answer(lm_path):
    """The tiny Llama as an answer model (``task="next_token"``), loaded once per module."""
    from mi_core.models import load_model
    from mi_core.tasks import NEXT_TOKEN

    return load_model(lm_path, task=NEXT_TOKEN)


@pytest.fixture(scope="module")
def ioi(answer):
    """24 IOI prompts (ABBA) tokenised for the tiny Llama answer model."""
    from mi_core.data import load_prompt_task

    return load_prompt_task("ioi:abba", 24, tokenizer=answer.tokenizer)


@pytest.fixture(scope="module")
def lm_means(answer, ioi):
    """The tiny Llama's mean activations over :func:`ioi`."""
    from mi_core.data import pair_batches
    from mi_core.interventions import compute_means

    return compute_means(answer, pair_batches(ioi, answer.tokenizer, batch_size=8))


@pytest.fixture(scope="session")
def minilm():
    """The real all-MiniLM-L6-v2 as an MNLI classifier (fresh head, seed 0)."""
    from mi_core.models import load_model

    return load_model("minilm", task="mnli", seed=0)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and do not fight other processes for cores)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def llama():
    """A tiny random Llama-family HookedTransformer (grouped-query attention)."""
    from helpers import tiny_model

    return tiny_model("llama")


@pytest.fixture(scope="module")
def gpt2():
    """A tiny random GPT-2-family HookedTransformer."""
    from helpers import tiny_model

    return tiny_model("gpt2")


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def decoder(request):
    """A tiny random decoder, once per family: GPT-2 (LayerNorm, multi-head) and Llama
    (RMSNorm, grouped-query attention)."""
    from helpers import tiny_model

    return tiny_model(request.param)


@pytest.fixture
def no_data_dir(monkeypatch):
    """No test may reach the hub or the real data: offline, and a data directory only where
    the test sets one (``MI_CORE_DATA_DIR`` and ``HF_DATASETS_OFFLINE`` unset)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("MI_CORE_DATA_DIR", raising=False)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoints):
    """The tiny random BERT classifier (an MNLI head), loaded as mi_core loads any model."""
    from mi_core.models import load_model

    return load_model(tiny_checkpoints["bert-cls"], task="mnli")


@pytest.fixture(scope="module")
def train(data_dir):
    """48 MNLI training pairs: the pruning tests' training set."""
    from mi_core.data import load_pairs

    return load_pairs("mnli:train", max_examples=48)


@pytest.fixture(scope="module")
def means(tiny, train):
    """The tiny classifier's mean activations on ``train``."""
    from mi_core.data import pair_batches
    from mi_core.interventions import compute_means

    return compute_means(tiny, pair_batches(train, tiny.tokenizer, batch_size=16))


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M-Instruct (processed weights cached in MI_CORE_CACHE_DIR)."""
    from mi_core.models import load_model

    return load_model("smollm2")


def pytest_configure(config):
    """Deterministic kernels for the whole session: an operation that has none fails loudly
    rather than making a comparison flaky (tests/README.md says which comparisons are exact)."""
    import torch

    torch.use_deterministic_algorithms(True)


def pytest_terminal_summary(terminalreporter):
    """The machine's numerics after the results (shown under ``-q`` too), so that a failing log
    names the CPU it ran on."""
    terminalreporter.write_line(_numerics())


def _numerics() -> str:
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):  # no /proc (macOS): the platform's name
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if "model name" in line)
    blas = "mkl" if torch.backends.mkl.is_available() else "other"
    return (
        f"numerics: {cpu}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"BLAS {blas}, ATen {torch.backends.cpu.get_cpu_capability()}"
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run only where torch sees a CUDA GPU; elsewhere they are skipped
    with the reason (they still run on a GPU machine: ``pytest -m gpu``)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
