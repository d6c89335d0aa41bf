"""MIB's tasks (:mod:`mi_core.data.mib_tasks`): rows read from a local copy in the hub's
schema, from the offline generators, and filtered and turned into examples exactly as MIB's
own ``HFEAPDataset`` (imported from ../shared/peers/mib) does on the same rows."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mi_core.circuits.config import AttributeConfig
from mi_core.circuits.job import load_circuit_pairs
from mi_core.data.mib_tasks import (
    GENERATED_TASKS,
    MIB_TASKS,
    generate_mib_rows,
    mib_examples,
    mib_pairs,
    mib_rows,
)
from mi_core.errors import ConfigError, DataError
from mi_core.testing import load_mib_peer

PEERS = Path(__file__).resolve().parents[3] / "shared" / "peers" / "mib"


def _rows(task: str) -> list[dict]:
    """Rows of ``task`` in the hub's schema: generated ones (ARC: MCQA's, the same schema),
    and some MIB's filter drops (a two-token name, an answer letter of another length, a
    subtraction among additions, a missing counterfactual)."""
    rows = generate_mib_rows("mcqa" if task.startswith("arc") else task, 12, seed=3)
    if task == "ioi":
        rows[1]["metadata"]["random_c"] = "Bartholomew-Smith"
    elif task == "mcqa" or task.startswith("arc"):
        rows[2]["symbol_counterfactual"]["choices"]["label"] = ["A-A", "B-B", "C-C", "D-D"]
    else:
        rows[0]["operator"] = "-" if task == "arithmetic_addition" else "+"
        rows[3]["random_counterfactual"] = None
    return rows


@pytest.fixture
def mib_copy(tmp_path, monkeypatch):
    """A local copy of every task's validation split in ``$MI_CORE_MIB_DIR``."""
    for task, name in MIB_TASKS.items():
        folder = tmp_path / name
        folder.mkdir()
        lines = [json.dumps(row) for row in _rows(task)]
        (folder / "validation.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("MI_CORE_MIB_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("task", list(MIB_TASKS))
def test_mib_examples_equal_mibs_dataset_on_the_same_rows(task, answer, mib_copy, monkeypatch):
    if not PEERS.is_dir():
        pytest.skip(f"MIB's code is not at {PEERS}")
    import datasets

    peer = load_mib_peer(PEERS)
    rows = mib_rows(task, "validation")  # the local copy
    assert rows == _rows(task)
    given = []

    def load_dataset(url, *args, **kwargs):  # MIB's hub read, given the same rows
        given.append(url)
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(peer.dataset, "load_dataset", load_dataset)
    theirs = peer.dataset.HFEAPDataset(f"mib-bench/{MIB_TASKS[task]}", answer.tokenizer,
                                       task=task)  # fmt: skip
    assert given == [f"mib-bench/{MIB_TASKS[task]}"]
    ours = mib_examples(task, rows, answer.tokenizer)
    expected = [theirs[i] for i in range(len(theirs))]
    assert len(ours) == len(expected) < len(rows)  # the filter dropped the odd rows
    assert ours == [(c, k, list(ids)) for c, k, ids in expected]


def test_mib_pairs_are_the_aligned_examples_as_prompt_pairs(answer, mib_copy):
    tokenizer = answer.tokenizer
    examples = mib_examples("ioi", mib_rows("ioi", "validation"), tokenizer)
    pairs = mib_pairs("mib:ioi", tokenizer, 5)
    assert len(pairs) == 5
    assert pairs.answer.tolist() == [e[2][0] for e in examples[:5]]
    assert pairs.distractor.tolist() == [e[2][1] for e in examples[:5]]
    first = tokenizer(examples[0][0], add_special_tokens=False).input_ids
    start = int(tokenizer.bos_token_id is not None)  # after the BOS, where there is one
    assert pairs.clean_ids[0, start : start + len(first)].tolist() == first
    # the same spec as circuit data, for a language model
    lm = SimpleNamespace(tokenizer=tokenizer, model_name="a language model")
    torch.testing.assert_close(load_circuit_pairs(lm, "mib:ioi", 5).answer, pairs.answer)


@pytest.mark.parametrize("task", GENERATED_TASKS)
def test_the_templated_tasks_are_generated_offline(task, answer):
    pairs = mib_pairs(f"mib:{task}:generated", answer.tokenizer, 6, seed=1)
    again = mib_pairs(f"mib:{task}:generated", answer.tokenizer, 6, seed=1)
    assert len(pairs) == 6 and torch.equal(pairs.clean_ids, again.clean_ids)
    other = mib_pairs(f"mib:{task}:generated", answer.tokenizer, 6, seed=2)
    assert not torch.equal(pairs.clean_ids, other.clean_ids)
    # the counterfactual changes the answer: IOI's flips the names, MCQA's the letters
    if task in ("ioi", "mcqa"):
        assert bool((pairs.answer != pairs.distractor).all())


def test_an_mib_task_that_cannot_be_read_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("MI_CORE_MIB_DIR", str(tmp_path))  # no copy there; the hub is offline
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    unread = (r"MIB task ioi \(validation\) could not be read from the hub mib-bench/ioi .* no "
              r"local copy .*; or mib:ioi:generated offline")  # fmt: skip
    with pytest.raises(DataError, match=unread):
        mib_rows("ioi", "validation")
    with pytest.raises(DataError, match="arc_easy is not made from templates"):
        mib_pairs("mib:arc_easy:generated", None, 4)
    with pytest.raises(DataError, match="unknown MIB task 'copycolors'"):
        mib_pairs("mib:copycolors", None, 4)
    with pytest.raises(DataError, match="unknown MIB split 'dev'"):
        mib_pairs("mib:ioi:dev", None, 4)
    # as circuit data: refused when the config is made, before any model loads
    with pytest.raises(ConfigError, match="unknown MIB task 'ioi2'"):
        AttributeConfig(model="smollm2", data="mib:ioi2", out=str(tmp_path / "o"))
    bad = tmp_path / "ioi" / "validation.jsonl"
    bad.parent.mkdir()
    bad.write_text('{"prompt": "x"}\nnot json\n')
    with pytest.raises(DataError, match=r"validation.jsonl:2: not a valid JSON line"):
        mib_rows("ioi", "validation")
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(DataError, match="lacks what MIB reads"):
        mib_pairs("mib:ioi", None, 4)
