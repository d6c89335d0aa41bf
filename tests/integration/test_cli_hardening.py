"""Faults a fault sweep and a new user found: each through the command line (one stderr line
without a traceback, a non-zero exit, earlier files untouched) or the library call behind it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from helpers import one_error

from mi_core.cli import main

SWEEP = ["sweep", "--model", "m", "--train", "mnli:train", "--sparsities", "0.5", "--seeds", "1-1"]


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """A temporary directory of the test's own, standing in for the machine's shared /tmp."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    return shared


def test_the_output_lock_cannot_be_turned_into_a_write_anywhere(tmp_path, capsys, private_tmp):
    """The lock lived in a folder every user shares, opened with "a+" and truncated: another
    user's link there made a run overwrite any file its user could write. Now it lives in this
    user's own 0700 folder, is opened without following a link, and is refused otherwise."""
    from mi_core.errors import OutputError
    from mi_core.io import output_lock

    victim = tmp_path / "thesis.tex"
    victim.write_text("precious")
    out = tmp_path / "sweep"
    # another user's folder (a link to theirs) where this user's lock folder belongs
    planted = tmp_path / "attacker"
    planted.mkdir(mode=0o777)
    folder = private_tmp / f"mi_core-locks-{os.getuid()}"
    folder.symlink_to(planted)
    assert main([*SWEEP, "--out", str(out)]) == 2
    assert "is not a folder of this user's" in one_error(capsys)
    assert list(planted.iterdir()) == [] and not out.exists()

    # this user's folder, left open to others: closed on first use
    folder.unlink()
    folder.mkdir(mode=0o700)
    folder.chmod(0o777)
    with output_lock(out):
        assert oct(folder.stat().st_mode & 0o777) == oct(0o700)
    # a link planted at the lock's own name, to the victim's file: refused, file untouched
    (lock,) = folder.iterdir()
    lock.unlink()
    lock.symlink_to(victim)
    with pytest.raises(OutputError, match="cannot open the output lock"):
        with output_lock(out):
            raise AssertionError("the lock was taken through a link")
    assert main([*SWEEP, "--out", str(out)]) == 2
    assert "cannot open the output lock" in one_error(capsys)
    assert victim.read_text() == "precious"


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a folder to another user needs root")
def test_a_lock_folder_of_another_user_is_refused(tmp_path, capsys, private_tmp):
    folder = private_tmp / f"mi_core-locks-{os.getuid()}"
    folder.mkdir(mode=0o700)
    os.chown(folder, os.getuid() + 4242, -1)
    assert main([*SWEEP, "--out", str(tmp_path / "sweep")]) == 2
    assert "is not a folder of this user's" in one_error(capsys)
    assert list(folder.iterdir()) == []


HOSTILE = "<svg onload=alert(9)>"


def test_every_page_writer_escapes_the_names_it_is_given(tmp_path, llama):
    """A data file named ``<svg onload=alert(9)>.jsonl`` ran script in the separability
    page's title; every page mi_core writes escapes every name that reaches it."""
    import plotly.graph_objects as go
    import torch
    from helpers import random_tokens

    from mi_core.interventions.ablation_table import AblationTable
    from mi_core.interventions.edges import Graph
    from mi_core.methods.separability import SeparabilityConfig, run_separability
    from mi_core.methods.separability.report import figures_html
    from mi_core.methods.separability.run import TaskTokens
    from mi_core.naming import Component
    from mi_core.viz.attention_html import attention_view_html
    from mi_core.viz.circuits import circuit_graph_html
    from mi_core.viz.figures import write_figure_html
    from mi_core.viz.page import ReportSection, render_html

    focus = TaskTokens(HOSTILE, random_tokens(4, 8, 1), random_tokens(2, 8, 2))
    cripple = TaskTokens(f"{HOSTILE}.jsonl", random_tokens(4, 8, 3), random_tokens(2, 8, 4))
    result = run_separability(llama, focus, cripple, SeparabilityConfig(steps=1, ff_frac=0.1))
    head = Component.parse("L0.H1")
    table = AblationTable([HOSTILE], {HOSTILE: 0.5}, {head: {HOSTILE: 0.4}}, [head])
    section = ReportSection(HOSTILE)
    frame = pd.DataFrame({HOSTILE: [HOSTILE]})
    section.blocks += [("text", HOSTILE), ("table", (frame, HOSTILE, 2))]
    graph = Graph.from_model(llama)
    pages = {
        "separability": figures_html(result, include_plotlyjs=False),
        "report": render_html(HOSTILE, [section]),
        "ablation table": table.html(),
        "circuit": circuit_graph_html(graph, torch.zeros(graph.n_edges), title=HOSTILE),
        "attention": attention_view_html(
            [HOSTILE, "b"], torch.full((2, 2, 2), 0.5), title=HOSTILE
        ),
        "figure": write_figure_html(
            go.Figure(layout={"title": HOSTILE}), tmp_path / "f.html", include_plotlyjs=False,
            title=HOSTILE,
        ).read_text(),
    }  # fmt: skip
    for name, page in pages.items():
        assert HOSTILE not in page and "<svg onload" not in page, name
        assert "&lt;svg onload=alert(9)&gt;" in page or "\\u003csvg" in page, name


def _copy(checkpoint, to):
    import shutil

    return shutil.copytree(checkpoint, to)


def _eval(model, tmp_path, *extra) -> list[str]:
    return ["eval", "--model", str(model), "--data", "hans:so_swap", "--max-examples", "4",
            "--out", str(tmp_path / "r.csv"), *extra]  # fmt: skip


def test_a_checkpoint_without_its_tokenizer_files_is_refused(tmp_path, capsys, tiny_checkpoints):
    """It loaded a tokenizer of its 5 special tokens alone (every word [UNK]) and reported an
    accuracy."""
    for kind in ("bert-cls", "gpt2-lm"):
        folder = _copy(tiny_checkpoints[kind], tmp_path / kind)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).unlink()
        argv = _eval(folder, tmp_path, "--task", "mnli")
        assert main(argv) == 2
        assert "has no tokenizer files" in one_error(capsys)
        assert not (tmp_path / "r.csv").exists()


def test_weights_missing_some_or_all_tensors_are_refused_naming_them(
    tmp_path, capsys, tiny_checkpoints
):
    """transformers initialised them at random and mi_core's quiet logging hid its report."""
    from safetensors.torch import load_file, save_file

    from mi_core.errors import ModelLoadError
    from mi_core.models import load_model

    for kind, drop in (("bert-cls", "bert.encoder.layer.0.attention.self.query.weight"),
                       ("llama-lm", "model.layers.1.mlp.up_proj.weight")):  # fmt: skip
        folder = _copy(tiny_checkpoints[kind], tmp_path / kind)
        weights = load_file(folder / "model.safetensors")
        del weights[drop]
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
        with pytest.raises(ModelLoadError, match=f"lack 1 of the model's tensors \\({drop}\\)"):
            load_model(folder)
    folder = tmp_path / "bert-cls"
    save_file({"unrelated": load_file(folder / "model.safetensors")["classifier.bias"]},
              folder / "model.safetensors", metadata={"format": "pt"})  # fmt: skip
    assert main(_eval(folder, tmp_path)) == 2
    assert "lack 57 of the model's tensors" in one_error(capsys)
    assert not (tmp_path / "r.csv").exists()
    # a pretrained body given a task: the head it lacks is made from the seed, as before
    body = load_model(tiny_checkpoints["gpt2-lm"], task="mnli")
    assert not body.head_from_checkpoint


def test_non_finite_weights_or_means_are_refused(tmp_path, capsys, tiny_checkpoints):
    """All-NaN weights, or a means file with a NaN, gave NaN logits and reported an accuracy
    (and NaN in the predictions)."""
    import torch
    from safetensors.torch import load_file, save_file

    from mi_core.errors import InterventionError
    from mi_core.interventions import ComponentMeans, load_means

    folder = _copy(tiny_checkpoints["bert-cls"], tmp_path / "nan")
    weights = load_file(folder / "model.safetensors")
    weights["bert.encoder.layer.1.output.dense.weight"][0, 0] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    assert main(_eval(folder, tmp_path)) == 2
    assert "hold NaN or infinite values (blocks.1.mlp.W_out)" in one_error(capsys)
    assert not (tmp_path / "r.csv").exists()

    means = ComponentMeans(torch.zeros(2, 4, 8), torch.zeros(2, 32), "m", "f")
    path = means.save(tmp_path / "means.safetensors")
    tensors = load_file(path)
    tensors["mlp_out"][1, 3] = float("inf")
    save_file(tensors, path, metadata=means.metadata())
    with pytest.raises(InterventionError, match="NaN or infinite values in mlp_out"):
        load_means(path)
    argv = _eval(tiny_checkpoints["bert-cls"], tmp_path, "--ablate", "L0.H1", "--means", str(path))
    assert main(argv) == 2
    assert "NaN or infinite values in mlp_out" in one_error(capsys)


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ({"format_version": "99"}, "means format '99' is not '1'"),
        ({"n_tokens": "lots"}, "n_tokens='lots' is not a count"),
    ],  # fmt: skip
)
def test_a_means_file_of_another_version_or_with_bad_counts_is_one_line(tmp_path, metadata, says):
    import torch
    from safetensors.torch import save_file

    from mi_core.errors import InterventionError
    from mi_core.interventions import ComponentMeans, load_means

    means = ComponentMeans(torch.zeros(2, 4, 8), torch.zeros(2, 32), "m", "f")
    path = tmp_path / "means.safetensors"
    save_file({"z": means.z, "mlp_out": means.mlp_out}, path, {**means.metadata(), **metadata})
    with pytest.raises(InterventionError, match=says):
        load_means(path)


def test_an_empty_ablate_is_refused(tmp_path, capsys, tiny_checkpoints):
    """``--ablate ''`` evaluated the full model as if it were ablated."""
    assert main(_eval(tiny_checkpoints["bert-cls"], tmp_path, "--ablate", " ")) == 2
    assert "--ablate is empty" in one_error(capsys)


def test_two_way_labels_are_refused_as_three_way_training_data(tmp_path, capsys, tiny_checkpoints):
    """A HANS-style file's label 1 (non-entailment) trained MNLI's class 1 (neutral)."""
    data = tmp_path / "two_way.jsonl"
    rows = [{"premise": f"A {i} sat .", "hypothesis": "It sat .",
             "label": ["entailment", "non-entailment"][i % 2]} for i in range(8)]  # fmt: skip
    data.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    argv = ["finetune", "--model", str(tiny_checkpoints["bert-cls"]), "--task", "mnli",
            "--train", str(data), "--steps", "1", "--out", str(tmp_path / "ft")]  # fmt: skip
    assert main(argv) == 2
    assert "has 2 labels (entailment, non-entailment) but a mnli model has 3" in one_error(capsys)
    assert not (tmp_path / "ft").exists()


def test_an_output_that_is_an_input_is_refused_before_any_work(tmp_path, capsys, tiny_checkpoints):
    """``eval --out`` equal to its ``--data`` replaced the data; ``means --out`` inside the model
    folder could replace ``model.safetensors``."""
    data = tmp_path / "pairs.csv"
    data.write_text("premise,hypothesis,label\nA b .,A .,0\n")
    argv = ["eval", "--model", str(tiny_checkpoints["bert-cls"]), "--data", str(data),
            "--out", str(data)]  # fmt: skip
    assert main(argv) == 2
    assert "is the input" in one_error(capsys)
    assert data.read_text() == "premise,hypothesis,label\nA b .,A .,0\n"
    model = _copy(tiny_checkpoints["bert-cls"], tmp_path / "model")
    weights = (model / "model.safetensors").read_bytes()
    argv = ["means", "--model", str(model), "--data", "mnli:train", "--max-examples", "2",
            "--out", str(model / "model.safetensors")]  # fmt: skip
    assert main(argv) == 2
    assert "is model.safetensors inside the input" in one_error(capsys)
    assert (model / "model.safetensors").read_bytes() == weights
    argv[-1] = str(model / "means.safetensors")  # beside the checkpoint's own files: fine
    assert main(argv) == 0


def _prune(model, out, sparsity="0.5") -> list[str]:
    return ["prune", "--model", str(model), "--train", "mnli:train", "--max-train-examples", "8",
            "--sparsity", sparsity, "--profile", "cofi", "--steps", "2", "--batch-size", "4",
            "--fill", "zero", "--eval", "hans:so_swap", "--max-eval-examples", "4",
            "--no-progress", "--out", str(out)]  # fmt: skip


def test_a_run_folder_without_its_config_is_not_a_finished_run(tmp_path, capsys, tiny_checkpoints):
    """A run whose folder was deleted mid-run recreated it without config.json; a re-run with
    another sparsity was then taken as finished (and wrote its config beside the old mask).
    A folder holding a stray metrics.json was taken for a finished run too."""
    import shutil

    out = tmp_path / "run"
    assert main(_prune(tiny_checkpoints["bert-cls"], out)) == 0
    (out / "config.json").unlink()  # as a run writing into a deleted folder leaves it
    mask = (out / "mask.json").read_text()
    assert main(_prune(tiny_checkpoints["bert-cls"], out, "0.3")) == 2
    assert "without the config.json that says which run wrote them" in one_error(capsys)
    assert not (out / "config.json").exists() and (out / "mask.json").read_text() == mask
    shutil.rmtree(out)
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    assert main(_prune(tiny_checkpoints["bert-cls"], out)) == 2
    assert "metrics.json without the config.json" in one_error(capsys)


@pytest.mark.parametrize("damage", ["mask.json", "subnetwork.safetensors", "both masks"])
def test_a_finished_run_checks_its_mask_files(damage, tmp_path, capsys, caplog, tiny_checkpoints):
    """A finished run whose mask.json or subnetwork.safetensors was cut short reported "mask
    and metrics in ..." and left the damage: now a file cut short is written again from the
    one that agrees with metrics.json, and a run with neither mask file whole is refused."""
    from mi_core.interventions import ComponentMask, load_intervention

    out = tmp_path / "run"
    assert main(_prune(tiny_checkpoints["bert-cls"], out)) == 0
    capsys.readouterr()
    kept = load_intervention(out / "subnetwork.safetensors")
    whole = {"mask.json": (out / "mask.json").read_text(), "subnetwork.safetensors": kept}
    names = ["mask.json", "mask.safetensors"] if damage == "both masks" else [damage]
    for name in names:
        (out / name).write_bytes((out / name).read_bytes()[:40])
    code = main(_prune(tiny_checkpoints["bert-cls"], out))
    if damage == "both masks":
        assert code == 2
        assert "mask.safetensors and mask.json are missing, damaged" in one_error(capsys)
        return
    assert code == 0 and f"{damage} is missing or damaged; written again" in caplog.text
    mask = ComponentMask.load(out / "mask.safetensors")
    subnetwork = load_intervention(out / "subnetwork.safetensors")
    assert (out / "mask.json").read_text() == whole["mask.json"]
    assert subnetwork.mask.removed() == mask.removed() and mask.removed()
    assert subnetwork.same_fill(whole["subnetwork.safetensors"])


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        ({"removed": "L0.H1"}, 'mask "removed" must be a list of component names'),
        ({"removed": ["L0.H1", None]}, 'mask "removed" must be a list'),
        ({"n_layers": 1e9}, "n_layers and n_heads must be whole numbers from 1 to 4096"),
        ({"n_layers": 6.7}, "must be whole numbers"),
        ({"kind": "mi_core.ComponentMeans"}, "its kind is 'mi_core.ComponentMeans'"),
        ({"format_version": "99"}, "mask format '99' is not '1'"),
    ],  # fmt: skip
)
def test_a_bad_mask_json_is_one_line(edit, says, tmp_path, capsys, tiny_checkpoints):
    """A string or null entry, a huge or fractional shape, another kind or version: each
    raised another exception type, tried to allocate 4e18 bytes, or was read silently."""
    import json

    from mi_core.errors import InterventionError
    from mi_core.interventions import ComponentMask
    from mi_core.interventions.components import ModelDims

    path = tmp_path / "mask.json"
    good = ComponentMask.from_removed(ModelDims(2, 4, 8, 32), ["L0.H1"]).to_json()
    path.write_text(json.dumps({**good, **edit}))
    with pytest.raises(InterventionError, match=says):
        ComponentMask.load(path)
    assert main(_eval(tiny_checkpoints["bert-cls"], tmp_path, "--mask", str(path))) == 2
    assert says.split("'")[0] in one_error(capsys)


def _edited_config(checkpoint, to, **changes):
    import json

    folder = _copy(checkpoint, to)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def test_broken_checkpoints_are_one_line_saying_what_is_wrong(tmp_path, capsys, tiny_checkpoints):
    """A config field of the wrong type and a malicious pickle ended in tracebacks; a head of
    another shape was called a truncated file; a config asking for remote code told the user to
    pass an option mi_core does not have."""
    import os
    import pickle

    from mi_core.errors import ModelLoadError
    from mi_core.models import load_model

    bert = tiny_checkpoints["bert-cls"]
    wrong_type = _edited_config(bert, tmp_path / "six", num_hidden_layers="six")
    assert main(_eval(wrong_type, tmp_path)) == 2
    assert "cannot read the config of" in one_error(capsys)

    evil = _copy(bert, tmp_path / "evil")
    (evil / "model.safetensors").unlink()

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    (evil / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    assert main(_eval(evil, tmp_path)) == 2
    assert "a pickle holding more than tensors, which mi_core never loads" in one_error(capsys)
    assert not (tmp_path / "pwned").exists()

    two = _edited_config(bert, tmp_path / "two", id2label={"0": "a", "1": "b"},
                         label2id={"a": 0, "b": 1})  # fmt: skip
    with pytest.raises(ModelLoadError, match="do not have the shapes its config.json gives"):
        load_model(two)

    remote = _edited_config(bert, tmp_path / "remote", model_type="my-own",
                            auto_map={"AutoConfig": "modeling.MyConfig"})  # fmt: skip
    assert main(_eval(remote, tmp_path)) == 2
    err = one_error(capsys)
    assert "mi_core never runs code from a checkpoint" in err and "trust_remote_code" not in err
    assert not (tmp_path / "r.csv").exists()


def test_file_faults_in_arguments_are_one_line(tmp_path, capsys, tiny_checkpoints):
    """A Latin-1 --config and a symbolic-link loop as --out ended in tracebacks; prune on a
    causal LM said mean ablation needs --means."""
    config = tmp_path / "c.json"
    config.write_bytes('{"model": "caf\xe9"}'.encode("latin-1"))
    assert main(["heuristic-core", "--config", str(config), "--out", str(tmp_path / "o")]) == 2
    assert "is not UTF-8 text" in one_error(capsys)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert main(_eval(tiny_checkpoints["bert-cls"], tmp_path)[:-1] + [str(loop)]) == 2
    assert "a symbolic link that leads back to itself" in one_error(capsys)
    assert main(_prune(tiny_checkpoints["llama-lm"], tmp_path / "run")) == 2
    err = one_error(capsys)  # sentence pairs given to a language model: what it can prune on
    assert "is a causal language model: node pruning runs on a sentence-pair classifier" in err
    assert "on a prompt task (ioi, ioi:abba" in err


def test_huge_seed_or_sparsity_lists_are_refused_at_once(tmp_path, capsys):
    """``--seeds 0-200000`` and ``--sparsities 0.000001:0.999:0.000005`` hung for minutes (a
    pairwise duplicate check); now they are refused in one line, and long lists are checked in
    one pass."""
    import time

    from mi_core.pruning.profiles import MAX_LIST, parse_seed_spec, parse_sparsities

    for flag, value in (("--seeds", "0-200000"), ("--sparsities", "0.000001:0.999:0.000005")):
        argv = [*SWEEP, "--out", str(tmp_path / "sw")]
        argv[argv.index(flag) + 1] = value
        started = time.perf_counter()
        assert main(argv) == 2
        assert f"at most {MAX_LIST}" in one_error(capsys)
        assert time.perf_counter() - started < 5
    started = time.perf_counter()
    assert len(parse_seed_spec(f"0-{MAX_LIST - 1}")) == MAX_LIST
    with pytest.raises(Exception, match=r"repeats seed\(s\) \[5\]"):
        parse_seed_spec(f"0-{MAX_LIST - 2},5")
    with pytest.raises(Exception, match=r"repeats value\(s\) \[0.5\]"):
        parse_sparsities("0.5,0.1:0.9:0.1")
    assert time.perf_counter() - started < 1


def test_an_immutable_output_is_refused_before_the_work(tmp_path, capsys):
    """The check read the mode bits, so a file marked immutable passed it and the job failed
    after all its work."""
    import subprocess

    kept = tmp_path / "results.csv"
    kept.write_text("dataset,n,accuracy\n")
    if subprocess.run(["chattr", "+i", str(kept)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i needs CAP_LINUX_IMMUTABLE")
    try:
        argv = ["eval", "--model", "no-such-model", "--data", "hans:so_swap", "--out", str(kept)]
        assert main(argv) == 2
        assert "results.csv: the file cannot be written" in one_error(capsys)
    finally:
        subprocess.run(["chattr", "-i", str(kept)], check=True)


def test_a_circuit_too_small_to_connect_says_how_small_one_can_be(caplog, monkeypatch):
    """``scores.circuit(k=50)`` on an 8-prompt IOI EAP came back with 0 edges, silently (on
    SmolLM2 the edges that would connect lie past the fill's tries; here it tries one)."""
    import torch
    from helpers import tiny_model

    import mi_core.circuits.attribution as attribution
    from mi_core.circuits.attribution import select_circuit
    from mi_core.interventions.edges import Graph

    monkeypatch.setattr(attribution, "FILL_TRIES", 1)
    graph = Graph.from_model(tiny_model("llama"))
    scores = torch.linspace(0.01, 0.5, graph.n_edges)
    scores[graph.edge_index("input->output")] = 0.0
    scores[graph.edge_index("L1.MLP->output")] = 10.0  # ranked first, yet no path alone
    scores[graph.edge_index("L0.MLP->L1.MLP")] = 9.0
    scores[graph.edge_index("input->L0.MLP")] = 8.0  # the third edge completes the path
    with caplog.at_level("WARNING", logger="mi_core.circuits.attribution"):
        assert select_circuit(graph, scores, 2).n_kept == 0
    assert "no connected circuit of at most 2 edges" in caplog.text
    assert "the smallest holds 3 edges" in caplog.text
    caplog.clear()
    assert select_circuit(graph, scores, 3).n_kept == 3 and not caplog.text


def test_prompt_pairs_from_strings_tokenise_and_check(tiny_checkpoints):
    """PromptPairs had no public constructor from text; IOI pairs are built by it."""
    from mi_core import PromptPairs, load_model
    from mi_core.data import ioi_pairs
    from mi_core.errors import DataError

    model = load_model(tiny_checkpoints["gpt2-lm"])
    tok = model.tokenizer
    prompts, corrupted = ["the cat sat on the", "a dog ran"], ["the dog sat on the", "a cat ran"]
    pairs = PromptPairs.from_strings(tok, prompts, [" mat", " far"], corrupted, [" hat", " hat"])
    bos = [] if tok.bos_token_id is None else [tok.bos_token_id]
    first = [*bos, *tok("the cat sat on the", add_special_tokens=False).input_ids]
    assert pairs.clean_ids[0, : len(first)].tolist() == first
    assert pairs.position.tolist() == [len(first) - 1, pairs.attention_mask[1].sum().item() - 1]
    assert pairs.answer[0].item() == tok(" mat", add_special_tokens=False).input_ids[0]
    assert pairs.distractor.tolist() == [tok(" hat", add_special_tokens=False).input_ids[0]] * 2
    alone = PromptPairs.from_strings(tok, ["a dog ran"], [" far"], ["a cat ran"])
    assert alone.distractor.tolist() == [-1]  # the metric takes the mean of the others
    with pytest.raises(DataError, match="prompt 0: the corrupted prompt has"):
        PromptPairs.from_strings(tok, ["a dog ran"], [" far"], ["a big cat ran"])
    with pytest.raises(DataError, match="prompt 0: the answer ' far away' is 2 tokens"):
        PromptPairs.from_strings(tok, ["a dog ran"], [" far away"], ["a cat ran"])
    with pytest.raises(DataError, match="2 prompts but 1 answers"):
        PromptPairs.from_strings(tok, ["a", "b"], [" c"], ["d", "e"])
    assert len(ioi_pairs(tok, n=4)) == 4


def test_ablation_table_takes_joint_sets_as_lists_of_names(tiny, train):
    """``ablation_table(joints=[["L0.H1", "L1.H0"]])`` was a TypeError comparing str and
    Component; every form of a joint set gives the same table."""
    from mi_core.interventions import ablation_table
    from mi_core.naming import Component

    data = [train.subset(list(range(8)))]
    kwargs = dict(heads="L0.H1", fill="zero", batch_size=8)
    as_text = ablation_table(tiny, data, joints=["L0.H1+L1.H0"], **kwargs)
    for joint in (["L0.H1", "L1.H0"], [(0, 1), (1, 0)], [Component(0, 1), Component(1, 0)]):
        table = ablation_table(tiny, data, joints=[joint], **kwargs)
        assert table.joints == as_text.joints and list(table.joints) == [
            (Component(0, 1), Component(1, 0))
        ]


def test_the_weight_cache_keeps_one_copy_per_model_and_option_and_can_be_cleared(
    tmp_path, capsys, caplog, monkeypatch, tiny_checkpoints
):
    """Two 683 MB SmolLM2 copies were left after one notebook and one CLI run: a checkpoint
    that changed on disk added a folder beside the stale one. Now a change replaces it, each
    folding option has its one folder, and ``mi-core cache`` lists sizes and clears them."""
    import os

    import torch

    from mi_core.models import load_model
    from mi_core.models.weight_cache import list_cache

    monkeypatch.setenv("MI_CORE_CACHE_DIR", str(tmp_path / "cache"))
    model = _copy(tiny_checkpoints["llama-lm"], tmp_path / "llama")
    ids = torch.tensor([[3, 5, 7, 9]])
    first = load_model(model)(ids)
    load_model(model)
    assert len(list_cache()) == 1
    load_model(model, fold_value_biases=False)  # another folding option: its own folder
    assert len(list_cache()) == 2
    weights = model / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    with caplog.at_level("INFO", logger="mi_core.models.loading"):
        again = load_model(model)(ids)  # the checkpoint changed: rebuilt in place
    assert "changed on disk" in caplog.text and torch.equal(first, again)
    cached = list_cache()
    assert len(cached) == 2 and all(c.bytes > 10_000 for c in cached)
    assert {c.source.split()[0] for c in cached} == {str(model.resolve())}
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert "2 cached model(s)" in out and str(model.resolve()) in out and " MB" in out
    assert main(["cache", "clear"]) == 0
    assert "removed" in capsys.readouterr().out and list_cache() == []
    assert main(["cache"]) == 2
    assert "choose what to do" in one_error(capsys)


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["prune", "--train", "mnli:trian", "--sparsity", "0.5"], "unknown data spec 'mnli:trian'"),
        (
            [
                "sweep",
                "--train",
                "mnli:train",
                "--eval",
                "hans:so_swp",
                "--sparsities",
                "0.5",
                "--seeds",
                "1-1",
            ],
            "unknown data spec 'hans:so_swp'",
        ),  # fmt: skip
        (
            [
                "prune",
                "--train",
                "mnli:train",
                "--sparsity",
                "0.5",
                "--means",
                "nowhere.safetensors",
            ],
            "means file nowhere.safetensors does not exist",
        ),  # fmt: skip
        (["means", "--data", "mnli:trian"], "unknown data spec 'mnli:trian'"),
        (["eval", "--data", "hans:so_swap", "--mask", "missing.json"], "does not exist"),
        (["eval", "--data", "hans:so_swap", "--ablate", "L0.Q1"], "cannot parse component"),
    ],
)
def test_data_specs_and_files_are_checked_before_the_model_loads(
    command, says, tmp_path, capsys, monkeypatch, tiny_checkpoints
):
    """A typo'd spec failed after the model had loaded (~9 s for the real ones)."""
    import mi_core.models

    def never(*args, **kwargs):
        raise AssertionError("the model loaded before the inputs were checked")

    monkeypatch.setattr(mi_core.models, "load_model", never)
    monkeypatch.chdir(tmp_path)
    argv = [command[0], "--model", str(tiny_checkpoints["bert-cls"]), *command[1:]]
    argv += ["--out", str(tmp_path / ("r.csv" if command[0] == "eval" else "o"))]
    if command[0] == "means":
        argv[-1] = str(tmp_path / "m.safetensors")
    assert main(argv) == 2
    assert says in one_error(capsys)


def test_a_circuit_page_is_legible_names_its_model_briefly_and_shows_its_error_bars(tmp_path):
    """A classifier's 6 layers were drawn in ~250 px under an absolute path, and the
    faithfulness curve's standard error was computed but not drawn."""
    import torch
    from helpers import tiny_model

    from mi_core.circuits import CircuitScore
    from mi_core.circuits.job import short_model_name
    from mi_core.interventions.edges import Graph
    from mi_core.viz.circuits import circuit_graph_figure, circuit_graph_html, faithfulness_figure

    assert short_model_name("minilm") == "minilm"
    assert short_model_name("EleutherAI/pythia-70m") == "EleutherAI/pythia-70m"
    assert (
        short_model_name(str(tmp_path / "runs" / "ft" / "checkpoint-3000")) == "ft/checkpoint-3000"
    )
    assert short_model_name(str(tmp_path / "my-model")) == "my-model"
    graph = Graph.from_model(tiny_model("llama"))
    assert circuit_graph_figure(graph, torch.ones(graph.n_edges)).layout.height >= 650
    rows = [CircuitScore(n_edges=k, fraction=k / 110, metric=0.0, full=1.0, empty=0.0,
                         faithfulness=k / 110, kl=0.0, faithfulness_se=0.01 * k)
            for k in (11, 55, 110)]  # fmt: skip
    (trace,) = faithfulness_figure({"eap": rows}).data
    assert list(trace.error_y.array) == [0.11, 0.55, 1.1]
    page = circuit_graph_html(graph, torch.ones(graph.n_edges), curve=rows)
    assert page.count("plotly-graph-div") == 2 and "Faithfulness against circuit size" in page


@pytest.mark.parametrize("fixed", [True, False])
def test_ctrl_c_while_the_interpreter_exits_prints_no_traceback(fixed, tmp_path):
    """A Ctrl-C pressed as a finished command's interpreter shut down (torch's exit handlers
    take a moment) printed a traceback; the program ignores it once its work is done. The
    exit handler here presses it; without the program's entry point, the traceback shows."""
    import subprocess
    import sys

    script = (
        "import atexit, os, signal, sys, time\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)))\n"
        "from mi_core.cli import entry, main\n"
        f"entry() if {fixed} else sys.exit(main())\n"
    )
    env = {**os.environ, "MI_CORE_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script, "cache", "list"], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "cached model(s)" in done.stdout
    assert ("KeyboardInterrupt" in done.stderr) is not fixed, done.stderr
    assert done.returncode == 0 or not fixed


def test_walkthroughs_use_a_fine_tuned_model_made_once_or_the_demo_s(tmp_path, monkeypatch, capsys):
    """Notebooks showed a random head's chance-level numbers. They load walkthrough_classifier:
    ``make demo``'s last checkpoint when it has run, else a short fine-tune made once, kept in
    the cache folder and reused, saying which."""
    import mi_core.training.walkthrough as walkthrough
    from mi_core.training.walkthrough import walkthrough_classifier

    monkeypatch.setenv("MI_CORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    calls = []

    def fake_finetune(config, progress=True):  # writes what a finished fine-tune leaves
        calls.append(config)
        (Path(config.out) / f"checkpoint-{config.steps}").mkdir(parents=True)
        (Path(config.out) / f"checkpoint-{config.steps}" / "trainer_state.json").write_text("{}")

    monkeypatch.setattr(walkthrough, "finetune", fake_finetune)
    first = walkthrough_classifier("mnli", steps=7)
    assert first == tmp_path / "cache" / "walkthrough" / "minilm-mnli-7" / "checkpoint-7"
    assert "fine-tuning MiniLM on mnli for 7 steps" in capsys.readouterr().out
    assert (calls[0].lr, calls[0].batch_size, calls[0].train) == (1e-4, 16, "mnli:train")
    assert walkthrough_classifier("mnli", steps=7) == first and len(calls) == 1  # reused
    demo = tmp_path / "demo-output" / "report" / "finetune"
    for step in (400, 1200):
        (demo / f"checkpoint-{step}").mkdir(parents=True)
        (demo / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")  # a notebook's folder, beside the demo's output
    assert walkthrough_classifier("mnli") == demo / "checkpoint-1200"
    assert "the demo's fine-tuned MiniLM" in capsys.readouterr().out
    assert walkthrough_classifier("qqp", steps=7).parent.name == "minilm-qqp-7"  # not MNLI's
