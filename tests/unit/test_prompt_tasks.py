"""Prompt tasks (the heuristic-core method on language models): IOI's template families, NLI
rendered as a prompt with a yes / no verbaliser, local JSONL files, and answer accuracy."""

from __future__ import annotations

import json

import pytest
import torch

from mi_core.circuits import answer_accuracy, kl_divergence, logit_difference
from mi_core.data import (
    NLI_VERBALISER,
    PromptExample,
    PromptPairs,
    PromptTask,
    load_pairs,
    load_prompt_task,
    parse_nli_prompt,
    render_nli_prompt,
)
from mi_core.data.circuit_pairs import IOI_TEMPLATES
from mi_core.errors import DataError


@pytest.fixture(scope="module")
def tokenizer():
    import transformers

    from mi_core.models.embedded import minilm_path

    return transformers.AutoTokenizer.from_pretrained(str(minilm_path()))


def test_ioi_splits_are_template_families(tokenizer):
    abba = load_prompt_task("ioi:abba", 40, tokenizer=tokenizer)
    baba = load_prompt_task("ioi:baba", 40, tokenizer=tokenizer)
    both = load_prompt_task("ioi", 40, tokenizer=tokenizer)
    assert abba.name == "ioi:abba" and len(abba) == 40 and abba.has_corrupted
    for example in abba.examples:  # the indirect object (the answer) is named first
        first, second = example.answer.strip(), example.distractor.strip()
        assert example.prompt.index(first) < example.prompt.index(second)
    for example in baba.examples:  # the subject first
        first, second = example.answer.strip(), example.distractor.strip()
        assert example.prompt.index(second) < example.prompt.index(first)

    def answer_first(example: PromptExample) -> bool:
        return example.prompt.index(example.answer.strip()) < example.prompt.index(
            example.distractor.strip()
        )

    assert len(IOI_TEMPLATES) == 10  # five of each family
    assert {answer_first(e) for e in both.examples} == {True, False}
    with pytest.raises(DataError, match="unknown IOI split 'ioi:abc'"):
        load_prompt_task("ioi:abc", 4)


def test_the_nli_prompt_round_trips_hans_rows(data_dir):
    hans = load_pairs("hans:lexical_overlap", max_examples=60)
    task = load_prompt_task("nli:hans:lexical_overlap", 60)
    assert len(task) == 60 and not task.has_corrupted
    for example, premise, hypothesis, label in zip(
        task.examples, hans.text_a, hans.text_b, hans.labels, strict=True
    ):
        assert parse_nli_prompt(example.prompt) == (premise, hypothesis)
        assert render_nli_prompt(premise, hypothesis) == example.prompt
        entailed = hans.label_names[label] == "entailment"
        assert example.answer == NLI_VERBALISER["entailment" if entailed else "other"]
        assert example.distractor == NLI_VERBALISER["other" if entailed else "entailment"]
    assert {e.answer for e in task.examples} == {" yes", " no"}  # both verdicts occur
    # neutral and contradiction are both " no"
    mnli = load_prompt_task("nli:mnli:validation_matched", 30)
    assert {e.answer for e in mnli.examples} == {" yes", " no"}
    with pytest.raises(DataError, match="not a prompt of the NLI template"):
        parse_nli_prompt("Is this entailed?")


def test_jsonl_tasks_are_read_and_checked_line_by_line(tmp_path, tokenizer):
    path = tmp_path / "capitals.jsonl"
    rows = [
        {"prompt": "the capital of france is", "answer": " paris", "distractor": " rome"},
        {"prompt": "the capital of italy is", "answer": " rome", "distractor": " paris"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    task = load_prompt_task(path)
    assert task.name == "capitals" and task.examples[1] == PromptExample(**rows[1])
    pairs = task.to_pairs(tokenizer)
    assert torch.equal(pairs.clean_ids, pairs.corrupted_ids)  # no corruption: itself
    assert (
        pairs.answer.tolist()
        == tokenizer([" paris", " rome"], add_special_tokens=False)["input_ids"][0]
        + tokenizer(" rome", add_special_tokens=False)["input_ids"]
    )
    for text, message in [
        ('{"prompt": "x"}', "line 1 lacks answer"),
        ('{"prompt": "x", "answer": " y", "label": 1}', "line 1 has unknown \\['label'\\]"),
        ('{"prompt": "x", "answer": 3}', "line 1: answer must be a non-empty string"),
        ("[1, 2]", "line 1: expected an object"),
        ('{"prompt": "x", "answer": " y"}\nnot json', "line 2: not JSON"),
    ]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        with pytest.raises(DataError, match=message):
            load_prompt_task(bad)
    mixed = [PromptExample("a", " b", " c"), PromptExample("d", " e")]
    with pytest.raises(DataError, match="some examples have a distractor and some do not"):
        PromptTask("mixed", tuple(mixed))
    with pytest.raises(DataError, match="unknown prompt task 'sst2'"):
        load_prompt_task("sst2")


def test_answer_accuracy_logit_difference_and_kl_by_hand():
    logits = torch.zeros(3, 4, 6)
    logits[0, 2, [1, 4]] = torch.tensor([2.0, 1.0])  # answer 1 beats distractor 4
    logits[1, 3, [1, 4]] = torch.tensor([0.5, 3.0])  # loses to it
    logits[2, 1, [2, 5]] = torch.tensor([1.0, 4.0])  # no distractor: 5 is the top, not 2
    pairs = PromptPairs(
        clean_ids=torch.zeros(3, 4, dtype=torch.long),
        corrupted_ids=torch.zeros(3, 4, dtype=torch.long),
        attention_mask=torch.ones(3, 4, dtype=torch.long),
        answer=torch.tensor([1, 1, 2]),
        distractor=torch.tensor([4, 4, -1]),
        position=torch.tensor([2, 3, 1]),
    )
    assert answer_accuracy(logits, pairs).tolist() == [1.0, 0.0, 0.0]
    logits[2, 1, 2] = 5.0
    assert answer_accuracy(logits, pairs).tolist() == [1.0, 0.0, 1.0]
    assert logit_difference(logits, pairs)[:2].tolist() == [1.0, -2.5]
    # KL at the answer position only: another position's logits change nothing
    other = logits.clone()
    other[0, 0] = 7.0
    assert kl_divergence(other, logits, pairs)[0] == 0
    other[0, 2, 1] = 0.0
    p = torch.softmax(logits[0, 2], -1)
    q = torch.softmax(other[0, 2], -1)
    expected = float((p * (p / q).log()).sum())
    assert kl_divergence(other, logits, pairs)[0].item() == pytest.approx(expected, rel=1e-6)


def test_a_jsonl_file_is_a_prompt_task_only_when_it_holds_prompts(tmp_path):
    """.jsonl holds sentence pairs (premise, hypothesis, label) or prompts (prompt, answer):
    the first record decides, so `mi-core means --data pairs.jsonl` stays a pair job."""
    from mi_core.data import is_prompt_spec

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"premise": "a", "hypothesis": "b", "label": 0}) + "\n")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n" + json.dumps({"prompt": "a b", "answer": " c"}) + "\n")
    assert not is_prompt_spec(pairs) and is_prompt_spec(prompts)
    assert not is_prompt_spec(tmp_path / "missing.jsonl")  # the pair loader says it is missing
    assert is_prompt_spec("ioi:abba") and is_prompt_spec("nli:hans:so_swap")
    assert not is_prompt_spec("mnli:train") and not is_prompt_spec("hans:so_swap")
