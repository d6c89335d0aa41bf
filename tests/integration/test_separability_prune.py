"""Iterative pruning, metrics, resuming, outputs and the ``mi-core separability`` command."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from helpers import mlp_stats_of_both, random_tokens, tasks, tiny_model

from mi_core.cli import main
from mi_core.errors import ConfigError
from mi_core.evaluation.next_token import evaluate_next_token
from mi_core.interventions.neurons import PruneMasks
from mi_core.methods.separability.report import OUTPUT_FILES, write_separability_outputs
from mi_core.methods.separability.run import SeparabilityConfig, run_separability
from mi_core.statistics.activations import collect_activation_stats
from mi_core.viz.separability import score_distribution_figure, trajectory_figure


def test_metrics_equal_a_direct_computation(llama):
    tokens = random_tokens(3, 10, seed=4)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[1, 7:] = False
    skip = torch.tensor([3, 5, 8, 13, 21, 34, 55, 89])
    ours = evaluate_next_token(llama, tokens, mask, skip_tokens=skip, batch_size=2)
    with torch.no_grad():
        logits = llama(tokens, attention_mask=mask.long())[:, :-1].double()
    targets = tokens[:, 1:]
    valid = mask[:, :-1] & mask[:, 1:]
    logits, targets = logits[valid], targets[valid]
    loss = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    top10 = logits.topk(10, dim=-1).indices
    hit1 = logits.argmax(-1) == targets
    hit10 = (top10 == targets[:, None]).any(-1)
    kept = ~torch.isin(targets, skip)
    assert ours["n_tokens"] == int(valid.sum()) == 3 * 9 - 3
    assert ours["loss"] == pytest.approx(float(loss.mean()), rel=1e-5)
    assert ours["top1"] == pytest.approx(float(hit1.double().mean()))
    assert ours["top10"] == pytest.approx(float(hit10.double().mean()))
    assert ours["n_skip_tokens"] == int(kept.sum())
    assert ours["skip50_loss"] == pytest.approx(float(loss[kept].mean()), rel=1e-5)
    assert ours["skip50_top1"] == pytest.approx(float(hit1[kept].double().mean()))
    assert ours["skip50_top10"] == pytest.approx(float(hit10[kept].double().mean()))


def test_run_prunes_geometrically_and_records_a_trajectory(llama):
    focus, cripple = tasks()
    config = SeparabilityConfig(
        steps=3,
        ff_frac=0.1,
        attn_frac=0.05,
        scoring="freq",
        random_baseline=True,
        batch_size=4,
        schedule="remaining",
    )
    seen = []
    result = run_separability(llama, focus, cripple, config, on_step=seen.append)
    frame = result.trajectory
    assert len(seen) == len(frame) == 2 * 4
    ours, rand = result.run_frame(), result.run_frame("random")
    n_ff = llama.cfg.n_layers * llama.cfg.d_mlp  # 96
    expected, left = [0], n_ff
    for _ in range(3):
        left -= int(0.1 * left + 0.5)
        expected.append(n_ff - left)
    assert ours["ff_pruned"].tolist() == expected == rand["ff_pruned"].tolist()
    assert ours["attn_pruned"].tolist() == rand["attn_pruned"].tolist()
    assert result.masks.n_ff_pruned == expected[-1]
    assert (result.masks.ff_step.unique().tolist()) == [0, 1, 2, 3]
    assert not torch.equal(result.masks.ff_step, result.random_masks.ff_step)
    # step 0 is the unpruned model, shared by both runs
    for column in ("focus_loss", "cripple_top10"):
        assert ours[column].iloc[0] == rand[column].iloc[0]
    assert {"focus_skip50_top1", "cripple_skip50_loss", "ff_threshold"} <= set(frame.columns)
    summary = result.summary()
    assert set(summary["areas"]) >= {"loss", "top1", "skip50_top10"}
    assert "random_areas" in summary and summary["steps_done"] == 3
    assert set(result.first_scores) == {"mlp", "attn"}


def test_selection_follows_the_scores(llama):
    # one step: the MLP neurons removed are exactly the top ratios of the statistic
    focus, cripple = tasks(seed=3)
    config = SeparabilityConfig(steps=1, ff_frac=0.25, scoring="abs", batch_size=8)
    result = run_separability(llama, focus, cripple, config)
    f, c = mlp_stats_of_both(llama, focus, cripple)
    # the reference's score, cripple / (focus + eps) with eps 1e-3 for MLP neurons (a test
    # that put 1e-6 on both sides held only while every bias and norm gain was 0 or 1)
    ratio = c.mlp.mean_abs / (f.mlp.mean_abs + 1e-3)
    k = round(0.25 * ratio.numel())
    expected = torch.zeros(ratio.numel(), dtype=torch.bool)
    expected[ratio.flatten().topk(k).indices] = True
    assert torch.equal(result.masks.ff_step.flatten() == 1, expected)


def test_head_unit_removes_whole_heads_and_mean_fill_uses_focus_means(llama):
    focus, cripple = tasks(seed=5)
    config = SeparabilityConfig(
        steps=2,
        ff_frac=0.0,
        attn_frac=0.25,
        attn_unit="head",
        head_aggregation="median",
        fill="mean",
        scoring="sqrt",
        random_baseline=True,
        schedule="remaining",
    )
    result = run_separability(llama, focus, cripple, config)
    removed = result.masks.attn_step > 0
    per_head = removed.any(-1)
    assert torch.equal(per_head, removed.all(-1))  # heads go whole
    assert result.masks.n_heads_pruned == 2 + 2  # 8 heads: 0.25 * 8, then 0.25 * 6 = 1.5 -> 2
    assert result.masks.n_ff_pruned == 0
    assert result.random_masks.n_heads_pruned == 4
    # the fills of the first step are the focus means of the unpruned model
    first = result.masks.attn_step == 1
    means = collect_activation_stats(llama, focus.stats, sites=("attn",)).attn.mean.float()
    torch.testing.assert_close(result.masks.attn_fill[first], means[first], atol=1e-6, rtol=0)
    assert result.masks.attn_fill[first].abs().sum() > 0


def test_svd_run_leaves_the_start_unchanged():
    model, reference = tiny_model("gpt2"), tiny_model("gpt2")
    focus, cripple = tasks(seed=6)
    config = SeparabilityConfig(steps=1, ff_frac=0.0, attn_frac=0.1, svd=True)
    result = run_separability(model, focus, cripple, config)
    base = evaluate_next_token(reference, focus.heldout, skip_tokens=None)
    assert result.run_frame()["focus_loss"].iloc[0] == pytest.approx(base["loss"], rel=1e-5)


def test_resume_after_a_crash_gives_the_same_run(llama, tmp_path):
    focus, cripple = tasks(seed=7)
    config = SeparabilityConfig(
        steps=2, ff_frac=0.1, attn_frac=0.1, random_baseline=True, fill="mean"
    )
    full = run_separability(llama, focus, cripple, config)

    class Crash(Exception):
        """A simulated kill."""

    def crash_at_step_2(row):
        if row["step"] == 2 and row["method"] == "random":
            raise Crash

    state = tmp_path / "state.safetensors"
    with pytest.raises(Crash):
        run_separability(llama, focus, cripple, config, state_path=state, on_step=crash_at_step_2)
    resumed_rows = []
    resumed = run_separability(
        llama, focus, cripple, config, state_path=state, on_step=resumed_rows.append
    )
    assert [r["step"] for r in resumed_rows] == [2, 2]  # step 1 was not redone
    pd.testing.assert_frame_equal(resumed.trajectory, full.trajectory, check_exact=False, rtol=1e-6)
    for name, tensor in full.masks.tensors().items():
        torch.testing.assert_close(resumed.masks.tensors()[name], tensor)
    # a finished run re-run does nothing more
    again = []
    run_separability(llama, focus, cripple, config, state_path=state, on_step=again.append)
    assert again == []
    import json

    from mi_core.io import read_safetensors, write_safetensors

    with pytest.raises(ConfigError, match="attn_fill, ff_fill, fill differ"):
        run_separability(llama, focus, cripple, config.replace(fill="zero"), state_path=state)
    # a state that names the fills by their former names (ff_offset, attn_offset, offset) is
    # of an older mi_core: one line says to re-run elsewhere
    tensors, metadata = read_safetensors(state)
    options = json.loads(metadata["config"])
    assert (options["ff_fill"], options["attn_fill"], options["fill"]) == ("mean",) * 3
    former = {"ff_fill": "ff_offset", "attn_fill": "attn_offset", "fill": "offset"}
    renamed = json.dumps({former.get(k, k): v for k, v in options.items()}, sort_keys=True)
    write_safetensors(state, tensors, {**metadata, "config": renamed})
    with pytest.raises(ConfigError, match=r"older mi_core \(it records no fill\)"):
        run_separability(llama, focus, cripple, config, state_path=state)
    write_safetensors(state, tensors, metadata)  # back to today's state
    with pytest.raises(ConfigError, match="ff_frac"):
        run_separability(
            llama, focus, cripple, SeparabilityConfig(steps=2, ff_frac=0.2), state_path=state
        )
    # a state of an older mi_core (its score, (c + eps) / (f + eps), not recorded) never
    # resumes, even with its options given again: one line says to re-run elsewhere
    tensors, metadata = read_safetensors(state)
    identity = json.loads(metadata["identity"])
    identity.pop("score")
    write_safetensors(state, tensors, {**metadata, "identity": json.dumps(identity)})
    older = r"state of an older mi_core \(it records no score formula\) and cannot resume: re-run"
    with pytest.raises(ConfigError, match=older):
        run_separability(llama, focus, cripple, config, state_path=state)
    write_safetensors(state, tensors, {k: v for k, v in metadata.items() if k != "identity"})
    with pytest.raises(ConfigError, match=older):
        run_separability(llama, focus, cripple, config, state_path=state)


@pytest.mark.parametrize(
    "bad",
    [
        dict(steps=0),
        dict(ff_frac=1.5),
        dict(ff_frac=0.0, attn_frac=0.0),
        dict(scoring="var"),
        dict(fill="median"),
        dict(attn_unit="layer"),
        dict(mode="both"),
    ],
)
def test_bad_config_is_rejected(bad):
    with pytest.raises(ConfigError):
        SeparabilityConfig(**bad).validate()


def test_outputs_and_figures(llama, tmp_path):
    focus, cripple = tasks(seed=8)
    config = SeparabilityConfig(steps=2, ff_frac=0.2, random_baseline=True, scoring="abs")
    result = run_separability(llama, focus, cripple, config)
    paths = write_separability_outputs(result, tmp_path, include_plotlyjs="cdn")
    assert {p.name for p in paths.values()} == set(OUTPUT_FILES.values())
    frame = pd.read_csv(paths["trajectory"])
    assert len(frame) == 6 and set(frame["method"]) == {"abs", "random"}
    summary = json.loads(paths["summary"].read_text())
    assert summary["focus"] == "low" and summary["pruned"]["ff_neurons"] == result.masks.n_ff_pruned
    assert PruneMasks.load(paths["masks"]).n_ff_pruned == result.masks.n_ff_pruned
    listing = json.loads(paths["listing"].read_text())
    assert [s["step"] for s in listing["steps"]] == [1, 2]
    html = paths["figures"].read_text()
    assert html.count("plotly-graph-div") >= 3
    fig = trajectory_figure(result.trajectory, metrics=("top10", "loss"))
    # per panel the diagonal and two methods with their closing legs; once, the legs' legend key
    assert len(fig.data) == 2 * 5 + 1
    heat = score_distribution_figure(result.first_scores["mlp"])
    assert heat.data[0].z.shape[0] == llama.cfg.n_layers
    assert abs(heat.data[0].z.sum(axis=1) - 1).max() < 1e-9


@pytest.fixture
def small_data_dir(tmp_path, monkeypatch):
    """A data directory with the shared layout and small made-up corpora (fast to tokenise)."""
    root = tmp_path / "data"
    (root / "text").mkdir(parents=True)
    articles = [
        f" = Article {i} = \n\n The river {i} flows past the old town , where people meet "
        f"every week to talk about the weather and the harvest of the year {1900 + i} .\n"
        for i in range(40)
    ]
    (root / "text" / "wikitext2_test.raw").write_text("".join(articles))
    modules = [
        {
            "path": f"mod{i}.py",
            "text": f"def f{i}(x):\n    return [y * {i} for y in range(x)]\n"
            f"\nclass C{i}:\n    def __init__(self):\n        self.v = f{i}({i})\n",
        }
        for i in range(60)
    ]
    (root / "text" / "python_stdlib_sample.jsonl").write_text(
        "".join(json.dumps(m) + "\n" for m in modules)
    )
    monkeypatch.setenv("MI_CORE_DATA_DIR", str(root))
    return root


def test_cli_runs_resumes_and_reports_bad_input(tiny_checkpoints, small_data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    args = [
        "separability",
        "--model",
        str(tiny_checkpoints["llama-lm"]),
        "--focus",
        "text:wikitext",
        "--cripple",
        "text:python",
        "--steps",
        "2",
        "--ff-frac",
        "0.1",
        "--attn-frac",
        "0.05",
        "--scoring",
        "freq",
        "--out",
        str(out),
        "--random",
        "--tokens",
        "256",
        "--eval-tokens",
        "64",
        "--window",
        "32",
        "--no-progress",
    ]
    assert main(args) == 0
    for name in OUTPUT_FILES.values():
        assert (out / name).exists(), name
    assert (out / "state.safetensors").exists()
    frame = pd.read_csv(out / "trajectory.csv")
    assert sorted(frame["step"].unique()) == [0, 1, 2]
    assert set(frame["method"]) == {"freq", "random"}

    def strict(value):  # other JSON parsers reject a bare NaN
        raise ValueError(f"{value} in summary.json")

    summary = json.loads((out / "summary.json").read_text(), parse_constant=strict)
    assert summary["model"] == str(tiny_checkpoints["llama-lm"]) and summary["tokens"] == 256
    assert "top1" in summary["areas"] and "random_areas" in summary
    printed = capsys.readouterr().out
    assert "separability" in printed
    loss = summary["areas"]["loss"]  # the loss area is printed too (top1 may be unmeasurable)
    assert f"loss: area {loss['area']:.3f}, separability {loss['separability_pct']:.1f}%" in printed
    # the same command again resumes a finished run: same outputs
    assert main(args) == 0
    pd.testing.assert_frame_equal(pd.read_csv(out / "trajectory.csv"), frame)
    # other options on the same directory: one-line error, exit 2, before loading anything
    assert main([*args, "--tokens", "512"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mi-core: error:") and "tokens" in err
    assert len(err.strip().splitlines()) == 1
    assert main([*args, "--ff-frac", "2"]) == 2
    # the output folder is a field of the config: a config file may name it, and a moved
    # folder resumes (where it lies is not one of the run's settings)
    i = args.index("--out")
    config_file = tmp_path / "job.json"
    moved = tmp_path / "moved"
    out.rename(moved)
    config_file.write_text(json.dumps({"out": str(moved)}))
    assert main(["separability", "--config", str(config_file), *args[1:i], *args[i + 2 :]]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(moved / "trajectory.csv"), frame)
    assert "out" not in SeparabilityConfig(out="x").pruning_options()
    # other weights at the same --model path: another run, refused (it resumed from the old
    # model's steps)
    import shutil

    from safetensors.torch import load_file, save_file

    copy = shutil.copytree(tiny_checkpoints["llama-lm"], tmp_path / "llama-copy")
    j = args.index("--model")
    same_path = [*args[: j + 1], str(copy), *args[j + 2 :]]
    same_path[same_path.index("--out") + 1] = str(tmp_path / "copy-run")
    assert main([*same_path, "--steps", "1"]) == 0
    state = (tmp_path / "copy-run" / "state.safetensors").read_bytes()
    weights = load_file(copy / "model.safetensors")
    save_file({k: v + 0.01 if v.is_floating_point() else v for k, v in weights.items()},
              copy / "model.safetensors", metadata={"format": "pt"})  # fmt: skip
    capsys.readouterr()
    assert main([*same_path, "--steps", "1"]) == 2
    assert "model_fingerprint" in capsys.readouterr().err
    assert (tmp_path / "copy-run" / "state.safetensors").read_bytes() == state


def test_cli_learned_separability_writes_all_three_trajectories(
    tiny_checkpoints, small_data_dir, tmp_path, capsys
):
    out = tmp_path / "learned"
    args = [
        "separability", "--model", str(tiny_checkpoints["llama-lm"]), "--focus",
        "text:wikitext", "--cripple", "text:python", "--steps", "2", "--ff-frac", "0.1",
        "--attn-frac", "0.05", "--scoring", "abs", "--random", "--method", "both",
        "--learn-steps", "3", "--tokens", "256", "--eval-tokens", "64", "--window", "32",
        "--out", str(out), "--no-progress",
    ]  # fmt: skip
    assert main(args) == 0
    loss = json.loads((out / "summary.json").read_text())["learned_areas"]["loss"]["area"]
    assert f"(learned: area {loss:.3f}) (random: area" in capsys.readouterr().out
    frame = pd.read_csv(out / "trajectory.csv")
    assert set(frame["method"]) == {"abs", "random", "learned"}
    summary = json.loads((out / "summary.json").read_text())
    assert {"areas", "random_areas", "learned_areas"} <= set(summary)
    assert summary["config"]["selection"] == "both"
    assert (out / "learned" / "checkpoint.safetensors").exists()
    page = (out / "figures.html").read_text()
    assert "learned" in page and "random" in page
