"""Pair data: specs, the real shared data, a synthetic data dir, local files, fail-fast errors."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from helpers import REAL_DATA_DIR

import mi_core.data as data
from mi_core.data import (
    HANS_PAPER_SUBCASES,
    HANS_SUBCASES,
    PairDataset,
    available_specs,
    load_pairs,
    model_num_labels,
)
from mi_core.errors import DataError, MiCoreError

REAL_DIR = REAL_DATA_DIR
needs_real = pytest.mark.skipif(
    not (REAL_DIR / "hans" / "heuristics_evaluation_set.txt").is_file(),
    reason="shared data directory not available",
)

HANS_HEADER = (
    "gold_label\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
    "sentence2_parse\tsentence1\tsentence2\tpairID\theuristic\tsubcase\ttemplate"
)


pytestmark = pytest.mark.usefixtures("no_data_dir")


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _hans_row(label: str, s1: str, s2: str, pid: str, heur: str, sub: str, tmpl: str) -> str:
    return "\t".join(
        [label, "( x )", "( y )", "(ROOT x)", "(ROOT y)", s1, s2, pid, heur, sub, tmpl]
    )


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    """A data directory with the shared layout and made-up contents."""
    root = tmp_path / "data"
    _jsonl(
        root / "mnli" / "train.jsonl",
        [
            {"premise": "A cat sleeps.", "hypothesis": "An animal rests.", "label": 0, "idx": 7},
            {"premise": "A dog runs.", "hypothesis": "The dog is asleep.", "label": 2, "idx": 8},
            {"premise": "Kids play.", "hypothesis": "Kids play outside.", "label": 1, "idx": 9},
        ],
    )
    _jsonl(
        root / "mnli" / "validation_matched.jsonl",
        [
            {"premise": "P1", "hypothesis": "H1", "label": 1, "idx": 0},
            {"premise": "P2", "hypothesis": "H2", "label": 2, "idx": 1},
        ],
    )
    _jsonl(
        root / "mnli" / "heldout.jsonl",
        [
            {"premise": "held p", "hypothesis": "held h", "label": 0, "idx": 3},
        ],
    )
    _jsonl(
        root / "qqp" / "train.jsonl",
        [
            {"question1": "How?", "question2": "How so?", "label": 1, "idx": 0},
            {"question1": "Why?", "question2": "When?", "label": 0, "idx": 1},
        ],
    )
    _jsonl(
        root / "qqp" / "validation.jsonl",
        [
            {"question1": "Q a", "question2": "Q b", "label": 0, "idx": 5},
        ],
    )
    hans = [HANS_HEADER]
    hans.append(
        _hans_row(
            "non-entailment",
            "The a saw the b .",
            "The b saw the a .",
            "ex0",
            "lexical_overlap",
            "ln_subject/object_swap",
            "temp1",
        )
    )
    hans.append(
        _hans_row(
            "non-entailment",
            "The c saw the d .",
            "The d saw the c .",
            "ex1",
            "lexical_overlap",
            "ln_subject/object_swap",
            "temp1",
        )
    )
    hans.append(
        _hans_row(
            "entailment",
            'The "e" slept .',
            "The e slept .",
            "ex2",
            "subsequence",
            "se_adjective",
            "temp9",
        )
    )
    hans.append(
        _hans_row(
            "non-entailment",
            "If the f ran , the g sat .",
            "The f ran .",
            "ex3",
            "constituent",
            "cn_embedded_under_if",
            "temp40",
        )
    )
    (root / "hans").mkdir()
    (root / "hans" / "heuristics_evaluation_set.txt").write_text("\n".join(hans) + "\n")
    (root / "paws_qqp").mkdir()
    (root / "paws_qqp" / "dev_and_test.tsv").write_text(
        "id\tsentence1\tsentence2\tlabel\n"
        '1\tIs "this" a quote ?\tIs this a "quote ?\t0\n'
        "2\tA b c ?\tC b a ?\t0\n"
        "3\tSame thing ?\tThe same thing ?\t1\n",
        encoding="utf-8",
    )
    return root


# ---------------------------------------------------------------------------------------------
# registry


def test_registry_lists_every_spec():
    specs = available_specs("pairs")
    for split in ("train", "validation_matched", "validation_mismatched", "heldout"):
        assert f"mnli:{split}" in specs
    assert {"qqp:train", "qqp:validation", "paws_qqp", "paws_qqp:adv", "hans"} <= set(specs)
    assert {"hans:lexical_overlap", "hans:subsequence", "hans:constituent"} <= set(specs)
    assert len(HANS_SUBCASES) == len(set(HANS_SUBCASES)) == 30
    assert all(f"hans:{s}" in specs for s in HANS_SUBCASES)
    assert {"hans:so_swap", "hans:prep", "hans:embed_if", "hans:embed_verb"} <= set(specs)
    assert set(HANS_PAPER_SUBCASES.values()) <= set(HANS_SUBCASES)
    assert available_specs("text") == ["text:wikitext", "text:python"]
    assert set(available_specs()) == set(specs) | {"text:wikitext", "text:python"}
    assert set(data.PAIR_SPECS) == set(specs)


def test_model_num_labels():
    assert model_num_labels("mnli") == 3
    assert model_num_labels("qqp") == 2
    with pytest.raises(DataError, match="mnli"):
        model_num_labels("sst2")


def test_unknown_spec_lists_valid_specs():
    with pytest.raises(DataError) as info:
        load_pairs("mnli:test_matched")
    msg = str(info.value)
    for spec in ("mnli:train", "hans:ln_subject/object_swap", "paws_qqp:adv", "qqp:validation"):
        assert spec in msg
    assert "\n" not in msg
    for bad in ("hans:no_such_subcase", "snli", "qqp:test", "paws_qqp:foo"):
        with pytest.raises(DataError, match="valid specs"):
            load_pairs(bad)


# ---------------------------------------------------------------------------------------------
# the real shared data


@needs_real
def test_real_glue_splits(monkeypatch):
    monkeypatch.setenv("MI_CORE_DATA_DIR", str(REAL_DIR))  # the env var alone is enough
    for spec, n in [
        ("mnli:train", 8999),
        ("mnli:heldout", 1000),
        ("mnli:validation_matched", 9815),
        ("qqp:train", 8999),
        ("qqp:validation", 1000),
    ]:
        ds = load_pairs(spec)
        assert len(ds) == n and ds.name == spec
        assert ds.meta["idx"] and len(ds.meta["idx"]) == n
        if spec.startswith("mnli"):
            assert (ds.task, ds.num_labels, ds.prediction_map) == ("mnli", 3, [0, 1, 2])
            assert ds.label_names == ["entailment", "neutral", "contradiction"]
            assert set(ds.labels) == {0, 1, 2}
        else:
            assert (ds.task, ds.num_labels, ds.prediction_map) == ("qqp", 2, [0, 1])
            assert set(ds.labels) == {0, 1}
        assert all(isinstance(t, str) and t for t in ds.text_a[:50])


@needs_real
def test_real_hans_counts():
    ds = load_pairs("hans", data_dir=REAL_DIR)
    assert len(ds) == 30000
    assert (ds.task, ds.num_labels, ds.prediction_map) == ("mnli", 2, [0, 1, 1])
    assert ds.label_names == ["entailment", "non-entailment"]
    assert Counter(ds.labels) == {0: 15000, 1: 15000}
    subcases = Counter(ds.meta["subcase"])
    assert len(subcases) == 30 and set(subcases.values()) == {1000}
    assert set(subcases) == set(HANS_SUBCASES)
    assert Counter(ds.meta["heuristic"]) == {
        "lexical_overlap": 10000,
        "subsequence": 10000,
        "constituent": 10000,
    }
    assert set(ds.meta) >= {"heuristic", "subcase", "template"}
    assert ds.text_a[0] == "The president advised the doctor ."
    for sub in HANS_SUBCASES:
        part = load_pairs(f"hans:{sub}", data_dir=REAL_DIR)
        assert len(part) == 1000 and set(part.meta["subcase"]) == {sub}
    # max_examples of several subcases takes each in turn (the first 300 rows had been one
    # subcase, all non-entailment), in file order within each
    few = load_pairs("hans", data_dir=REAL_DIR, max_examples=300)
    assert (
        set(Counter(few.meta["subcase"]).values()) == {10} and len(set(few.meta["subcase"])) == 30
    )
    assert Counter(few.labels) == {0: 150, 1: 150}
    constituent = load_pairs("hans:constituent", data_dir=REAL_DIR, max_examples=25)
    assert len(constituent) == 25 and len(set(constituent.meta["subcase"])) == 10
    assert (
        load_pairs("hans:so_swap", data_dir=REAL_DIR, max_examples=5).text_a
        == (load_pairs("hans:so_swap", data_dir=REAL_DIR).text_a[:5])
    )  # one subcase: the first rows, as before
    for short, sub in HANS_PAPER_SUBCASES.items():
        for spec in (f"hans:{short}", f"hans:{short.lower().replace('-', '_')}"):
            part = load_pairs(spec, data_dir=REAL_DIR)
            assert part.name == f"hans:{sub}" and len(part) == 1000
            assert set(part.labels) == {1}  # the paper's subcases are all non-entailment
    lex = load_pairs("hans:lexical_overlap", data_dir=REAL_DIR)
    assert len(lex) == 10000 and len(set(lex.meta["subcase"])) == 10


@needs_real
def test_real_paws_counts():
    ds = load_pairs("paws_qqp", data_dir=REAL_DIR)
    assert len(ds) == 677 and Counter(ds.labels) == {0: 486, 1: 191}
    assert (ds.task, ds.num_labels, ds.prediction_map) == ("qqp", 2, [0, 1])
    adv = load_pairs("paws_qqp:adv", data_dir=REAL_DIR)
    assert len(adv) == 486 and set(adv.labels) == {0}
    assert adv.meta["id"] == [i for i, y in zip(ds.meta["id"], ds.labels, strict=True) if y == 0]
    # the official TSV is unquoted: text with quote characters comes through as written
    with open(REAL_DIR / "paws_qqp" / "dev_and_test.tsv", encoding="utf-8") as handle:
        lines = handle.read().splitlines()[1:]
    assert [line.split("\t")[1] for line in lines] == ds.text_a


@needs_real
def test_real_missing_split_fails_fast():
    start = time.perf_counter()
    with pytest.raises(DataError) as info:
        load_pairs("mnli:validation_mismatched", data_dir=REAL_DIR)
    assert time.perf_counter() - start < 1.0
    assert str(REAL_DIR / "mnli" / "validation_mismatched.jsonl") in str(info.value)


# ---------------------------------------------------------------------------------------------
# a synthetic data directory (nothing depends on the real rows)


def test_tiny_dir_glue(tiny_dir, monkeypatch):
    ds = load_pairs("mnli:train", data_dir=tiny_dir)
    assert ds.text_a == ["A cat sleeps.", "A dog runs.", "Kids play."]
    assert ds.text_b[2] == "Kids play outside."
    assert ds.labels == [0, 2, 1] and ds.meta == {"idx": [7, 8, 9]}
    assert len(load_pairs("mnli:heldout", data_dir=tiny_dir)) == 1
    monkeypatch.setenv("MI_CORE_DATA_DIR", str(tiny_dir))
    assert load_pairs("mnli:validation_matched").labels == [1, 2]
    q = load_pairs("qqp:train")
    assert (q.text_a, q.labels, q.task) == (["How?", "Why?"], [1, 0], "qqp")
    assert len(load_pairs("qqp:validation")) == 1
    assert len(load_pairs("mnli:train", max_examples=2)) == 2
    assert len(load_pairs("mnli:train", max_examples=0)) == 0
    for bad in (-1, 2.0, True):  # True is an int to Python, not a count
        with pytest.raises(DataError, match="max_examples must be a non-negative int"):
            load_pairs("mnli:train", max_examples=bad)
    with pytest.raises(DataError, match="qqp"):
        load_pairs("mnli:train", task="qqp")


def test_tiny_dir_hans(tiny_dir):
    ds = load_pairs("hans", data_dir=tiny_dir)
    assert len(ds) == 4 and ds.labels == [1, 1, 0, 1]
    assert ds.text_a[2] == 'The "e" slept .'  # QUOTE_NONE: quotes kept verbatim
    assert ds.meta["template"] == ["temp1", "temp1", "temp9", "temp40"]
    assert ds.meta["pairID"] == ["ex0", "ex1", "ex2", "ex3"]
    swap = load_pairs("hans:so_swap", data_dir=tiny_dir)
    assert swap.text_b == ["The b saw the a .", "The d saw the c ."]
    assert swap.name == "hans:ln_subject/object_swap"
    assert load_pairs("hans:SUBSEQUENCE", data_dir=tiny_dir).meta["pairID"] == ["ex2"]
    assert load_pairs("hans:Embed-If", data_dir=tiny_dir).meta["pairID"] == ["ex3"]
    assert len(load_pairs("hans:so_swap", data_dir=tiny_dir, max_examples=1)) == 1
    with pytest.raises(DataError, match="no rows"):
        load_pairs("hans:ln_preposition", data_dir=tiny_dir)


def test_tiny_dir_paws(tiny_dir):
    ds = load_pairs("paws_qqp", data_dir=tiny_dir)
    assert ds.text_a[0] == 'Is "this" a quote ?' and ds.text_b[0] == 'Is this a "quote ?'
    assert ds.labels == [0, 0, 1] and ds.meta["id"] == [1, 2, 3]
    assert ds.label_names == ["not_paraphrase", "paraphrase"]
    adv = load_pairs("paws_qqp:adv", data_dir=tiny_dir)
    assert adv.meta["id"] == [1, 2] and adv.name == "paws_qqp:adv"
    assert ds.meta["split"] == ["dev_and_test"] * 3


def test_paws_uses_train_and_dev_and_test_when_both_are_there(tiny_dir, tmp_path, caplog):
    import shutil

    root = tmp_path / "paws-copy"
    shutil.copytree(tiny_dir, root)
    with caplog.at_level("WARNING"):
        alone = load_pairs("paws_qqp", data_dir=root)
    assert len(alone) == 3 and "train + dev_and_test" in caplog.text
    (root / "paws_qqp" / "train.tsv").write_text(
        "id\tsentence1\tsentence2\tlabel\n10\tX y ?\tY x ?\t0\n11\tP q ?\tP q !\t1\n",
        encoding="utf-8",
    )
    both = load_pairs("paws_qqp", data_dir=root)
    assert len(both) == 5 and both.meta["id"] == [10, 11, 1, 2, 3]
    assert both.meta["split"] == ["train", "train", "dev_and_test", "dev_and_test", "dev_and_test"]
    assert load_pairs("paws_qqp:adv", data_dir=root).meta["id"] == [10, 1, 2]
    # the file alone, by name (it had been read as train + dev_and_test), and the paper's
    # spelling
    assert load_pairs("paws_qqp:dev_and_test", data_dir=root).meta["id"] == [1, 2, 3]
    assert load_pairs("PAWS-QQP", data_dir=root).meta["id"] == both.meta["id"]


# ---------------------------------------------------------------------------------------------
# fail fast, never the hub


def _forbid_hub(monkeypatch):
    import mi_core.data._sources as sources

    def boom(*args, **kwargs):
        raise AssertionError("the hub must not be called")

    monkeypatch.setattr(sources, "_hub_reachable", boom)


@pytest.mark.parametrize(
    "spec,looked_for",
    [
        ("mnli:validation_matched", "mnli/validation_matched.jsonl"),
        ("mnli:train", "mnli/train.jsonl"),
        ("qqp:validation", "qqp/validation.jsonl"),
        ("hans", "hans/heuristics_evaluation_set.txt"),
        ("hans:so_swap", "hans/heuristics_evaluation_set.txt"),
        ("paws_qqp:adv", "paws_qqp/dev_and_test.tsv"),
    ],
)
def test_offline_without_data_dir_fails_at_once(monkeypatch, spec, looked_for):
    _forbid_hub(monkeypatch)
    start = time.perf_counter()
    with pytest.raises(DataError) as info:
        load_pairs(spec)
    assert time.perf_counter() - start < 0.5
    msg = str(info.value)
    assert looked_for in msg and "MI_CORE_DATA_DIR" in msg and "\n" not in msg
    assert isinstance(info.value, MiCoreError)


def test_offline_with_data_dir_names_the_file(tmp_path, monkeypatch):
    _forbid_hub(monkeypatch)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    (tmp_path / "mnli").mkdir()
    start = time.perf_counter()
    with pytest.raises(DataError) as info:
        load_pairs("mnli:validation_mismatched", data_dir=tmp_path)
    assert time.perf_counter() - start < 0.5
    assert str(tmp_path / "mnli" / "validation_mismatched.jsonl") in str(info.value)
    assert "nyu-mll/glue" in str(info.value)


def test_paws_and_heldout_have_no_hub_copy(tmp_path, monkeypatch):
    _forbid_hub(monkeypatch)
    monkeypatch.delenv("HF_HUB_OFFLINE")  # even online these fail at once
    with pytest.raises(DataError, match="PAWS scripts"):
        load_pairs("paws_qqp", data_dir=tmp_path)
    with pytest.raises(DataError, match="no hub copy"):
        load_pairs("mnli:heldout", data_dir=tmp_path)


def test_unreachable_hub_fails_at_once(tmp_path, monkeypatch):
    import mi_core.data._sources as sources

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: False)
    start = time.perf_counter()
    with pytest.raises(DataError, match="cannot be reached"):
        load_pairs("hans", data_dir=tmp_path)
    assert time.perf_counter() - start < 0.5


def test_hub_rows_are_converted(tmp_path, monkeypatch):
    """Online, the hub copy is read through datasets.load_dataset (faked here: no network)."""
    datasets = pytest.importorskip("datasets")
    import mi_core.data._sources as sources

    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        if args[0] == "jhu-cogsci/hans":
            return datasets.Dataset.from_dict(
                {
                    "premise": ["p0", "p1", "p2"],
                    "hypothesis": ["h0", "h1", "h2"],
                    "label": [0, 1, 1],
                    "heuristic": ["lexical_overlap"] * 2 + ["constituent"],
                    "subcase": ["ln_preposition", "ln_preposition", "cn_adverb"],
                    "template": ["t1", "t2", "t3"],
                }
            )
        return datasets.Dataset.from_dict(
            {"premise": ["a", "b"], "hypothesis": ["c", "d"], "label": [2, 0], "idx": [0, 1]}
        )

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    ds = load_pairs("mnli:validation_mismatched", max_examples=2)
    assert calls[-1] == (("nyu-mll/glue", "mnli"), {"split": "validation_mismatched[:2]"})
    assert (ds.labels, ds.num_labels, ds.meta["idx"]) == ([2, 0], 3, [0, 1])
    prep = load_pairs("hans:prep", data_dir=tmp_path)
    assert calls[-1][0] == ("jhu-cogsci/hans",)
    assert (prep.text_a, prep.labels, prep.prediction_map) == (["p0", "p1"], [0, 1], [0, 1, 1])

    def failing(*args, **kwargs):
        raise ConnectionError("boom")

    monkeypatch.setattr(datasets, "load_dataset", failing)
    with pytest.raises(DataError, match="ConnectionError: boom"):
        load_pairs("qqp:train")


def test_bad_data_dir():
    with pytest.raises(DataError, match="not a directory"):
        load_pairs("mnli:train", data_dir="/nonexistent/mi_core_data")


# ---------------------------------------------------------------------------------------------
# local files


def test_local_jsonl_mnli(tmp_path):
    path = tmp_path / "mine.jsonl"
    _jsonl(
        path,
        [
            {"premise": "a", "hypothesis": "b", "label": "contradiction"},
            {"premise": "c", "hypothesis": "d", "label": "Neutral"},
            {"premise": "e", "hypothesis": "f", "label": 0},
        ],
    )
    ds = load_pairs(str(path))
    assert (ds.task, ds.labels, ds.num_labels, ds.name) == ("mnli", [2, 1, 0], 3, "mine")
    assert len(load_pairs(str(path), max_examples=1)) == 1


def test_local_csv_qqp(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text(
        'question1,question2,label\n"Hi, there?",Hello?,duplicate\nA?,B?,not_duplicate\nC?,D?,1\n',
        encoding="utf-8",
    )
    ds = load_pairs(path)
    assert ds.text_a == ["Hi, there?", "A?", "C?"]
    assert (ds.task, ds.labels, ds.prediction_map) == ("qqp", [1, 0, 1], [0, 1])


def test_local_csv_from_excel_and_pandas(tmp_path):
    """Excel's "CSV UTF-8" starts with a byte-order mark; pandas writes int labels as 1.0 once
    the column had a NaN. Both load as the plain file does."""
    plain = "premise,hypothesis,label\nA cat sat.,A cat is sitting.,0\nX.,Y.,2\n"
    (tmp_path / "bom.csv").write_text(plain, encoding="utf-8-sig")
    (tmp_path / "floats.csv").write_text(plain.replace(",0\n", ",0.0\n").replace(",2\n", ",2.0\n"))
    assert (tmp_path / "bom.csv").read_bytes().startswith(b"\xef\xbb\xbf")
    for name in ("bom.csv", "floats.csv"):
        ds = load_pairs(tmp_path / name, task="mnli")
        assert (ds.text_a, ds.labels) == (["A cat sat.", "X."], [0, 2]), name
    (tmp_path / "half.csv").write_text("premise,hypothesis,label\nA.,B.,1.5\n")
    with pytest.raises(DataError, match="unknown label name '1.5'"):
        load_pairs(tmp_path / "half.csv", task="mnli")


def test_local_tsv_sentence_columns(tmp_path):
    hans_like = tmp_path / "h.tsv"
    hans_like.write_text(
        'sentence1\tsentence2\tlabel\nA b .\tB a .\tnon-entailment\nX "y" .\tX .\tentailment\n',
        encoding="utf-8",
    )
    ds = load_pairs(str(hans_like))
    assert (ds.task, ds.num_labels, ds.prediction_map) == ("mnli", 2, [0, 1, 1])
    assert ds.labels == [1, 0] and ds.text_a[1] == 'X "y" .'

    ints = tmp_path / "s.tsv"
    ints.write_text("sentence1\tsentence2\tlabel\na\tb\t0\nc\td\t1\n", encoding="utf-8")
    with pytest.raises(DataError, match="task="):
        load_pairs(str(ints))
    assert load_pairs(str(ints), task="qqp").task == "qqp"
    ds = load_pairs(str(ints), task="mnli")
    assert (ds.num_labels, ds.labels) == (3, [0, 1])
    three = tmp_path / "three.tsv"
    three.write_text("sentence1\tsentence2\tlabel\na\tb\t2\n", encoding="utf-8")
    assert load_pairs(str(three)).task == "mnli"
    with pytest.raises(DataError, match="outside"):
        load_pairs(str(three), task="qqp")


def test_multinli_rows_without_a_gold_label_are_left_out(tmp_path, caplog):
    """The official MultiNLI files mark no-consensus pairs '-': GLUE leaves them out (9,815
    matched pairs); the whole file had been refused with "unknown label name '_'"."""
    path = tmp_path / "multinli_dev.jsonl"
    _jsonl(path, [
        {"sentence1": "a", "sentence2": "b", "gold_label": "entailment", "pairID": "1"},
        {"sentence1": "c", "sentence2": "d", "gold_label": "-", "pairID": "2"},
        {"sentence1": "e", "sentence2": "f", "gold_label": "contradiction", "pairID": "3"},
    ])  # fmt: skip
    with caplog.at_level("WARNING", logger="mi_core.data.pairs"):
        ds = load_pairs(str(path))
    assert (ds.text_a, ds.labels, ds.task) == (["a", "e"], [0, 2], "mnli")
    assert "1 rows without a gold label ('-') left out" in caplog.text


def test_local_hans_like_ints(tmp_path):
    path = tmp_path / "hans_export.jsonl"
    _jsonl(
        path,
        [
            {
                "premise": "a",
                "hypothesis": "b",
                "label": 1,
                "heuristic": "subsequence",
                "subcase": "sn_NP/S",
                "template": "t",
            }
        ],
    )
    ds = load_pairs(str(path))
    assert (ds.num_labels, ds.prediction_map, ds.meta["subcase"]) == (2, [0, 1, 1], ["sn_NP/S"])


def test_local_file_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_pairs(str(tmp_path / "missing.jsonl"))
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"premise": "a", "hypothesis": "b", "label": 0}\n{"premise": oops\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2"):
        load_pairs(str(bad_json))
    ragged = tmp_path / "ragged.tsv"
    ragged.write_text("sentence1\tsentence2\tlabel\na\tb\t0\nc\td\n")
    with pytest.raises(DataError, match=r"ragged\.tsv:3: 2 fields"):
        load_pairs(str(ragged), task="qqp")
    cols = tmp_path / "cols.jsonl"
    _jsonl(cols, [{"text": "a", "label": 0}])
    with pytest.raises(DataError, match="premise, hypothesis, label"):
        load_pairs(str(cols))
    names = tmp_path / "names.jsonl"
    _jsonl(names, [{"premise": "a", "hypothesis": "b", "label": "maybe"}])
    with pytest.raises(DataError, match="unknown label name 'maybe'"):
        load_pairs(str(names))
    unlabelled = tmp_path / "unlabelled.jsonl"
    _jsonl(unlabelled, [{"premise": "a", "hypothesis": "b", "label": -1}])
    with pytest.raises(DataError, match="gold label"):
        load_pairs(str(unlabelled))
    mixed = tmp_path / "mixed.jsonl"
    _jsonl(mixed, [{"premise": "a", "hypothesis": "b", "label": "duplicate"}])
    with pytest.raises(DataError, match="task 'mnli'"):
        load_pairs(str(mixed), task="mnli")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="no rows"):
        load_pairs(str(empty))


def test_malformed_file_in_data_dir(tiny_dir):
    (tiny_dir / "mnli" / "train.jsonl").write_text('{"premise": "a"\n')
    with pytest.raises(DataError, match="train.jsonl:1"):
        load_pairs("mnli:train", data_dir=tiny_dir)
    hans = tiny_dir / "hans" / "heuristics_evaluation_set.txt"
    hans.write_text(HANS_HEADER + "\nentailment\tonly\tthree\n")
    with pytest.raises(DataError, match="fields"):
        load_pairs("hans", data_dir=tiny_dir)


# ---------------------------------------------------------------------------------------------
# PairDataset


def _hans_like() -> PairDataset:
    return PairDataset(
        name="toy",
        task="mnli",
        text_a=["a", "b", "c", "d"],
        text_b=["e", "f", "g", "h"],
        labels=[0, 1, 1, 0],
        num_labels=2,
        label_names=["entailment", "non-entailment"],
        prediction_map=[0, 1, 1],
        meta={"subcase": ["s1", "s2", "s2", "s1"]},
    )


def test_pair_dataset_subset_head_getitem():
    ds = _hans_like()
    sub = ds.subset([3, 1])
    assert (sub.text_a, sub.labels, sub.meta["subcase"]) == (["d", "b"], [0, 1], ["s1", "s2"])
    assert ds.subset(torch.tensor([True, False, False, True])).text_b == ["e", "h"]
    assert ds.head(2).text_a == ["a", "b"] and len(ds.head(10)) == 4
    assert ds[2] == {"text_a": "c", "text_b": "g", "label": 1, "subcase": "s2"}
    assert ds.model_num_labels == 3
    with pytest.raises(DataError):
        ds.subset([4])
    with pytest.raises(DataError, match="differ in length"):
        PairDataset("x", "mnli", ["a"], [], [0], 3, ["e", "n", "c"], [0, 1, 2])
    with pytest.raises(DataError, match="outside"):
        PairDataset("x", "qqp", ["a"], ["b"], [2], 2, ["n", "d"], [0, 1])


def test_score_collapses_mnli_predictions_for_hans():
    ds = _hans_like()
    # model classes: entailment, neutral, contradiction, entailment
    pred = [0, 1, 2, 0]
    assert ds.predictions_to_labels(pred).tolist() == [0, 1, 1, 0]
    assert ds.score(pred) == 1.0
    logits = torch.tensor([[3.0, 0, 0], [0, 0, 1], [0, 2, 0], [0, 5, 0]])
    assert ds.score(logits) == pytest.approx(0.75)
    assert ds.score(torch.tensor(pred)) == 1.0
    with pytest.raises(DataError, match="classes"):
        ds.score(torch.zeros(4, 2))
    with pytest.raises(DataError, match="4 examples"):
        ds.score([0, 1])
    with pytest.raises(DataError, match="0..2"):
        ds.predictions_to_labels([3])


@needs_real
def test_real_loading_is_fast():
    load_pairs("hans", data_dir=REAL_DIR)  # warm the file cache
    start = time.perf_counter()
    for spec in ("hans", "hans:so_swap", "mnli:validation_matched", "paws_qqp:adv"):
        load_pairs(spec, data_dir=REAL_DIR)
    assert time.perf_counter() - start < 5.0
