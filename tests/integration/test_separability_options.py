"""The report's separability method as the default, option by option: each test fails under the
other setting (schedule, per-site scoring, per-site mean fill, heads per step, the reference's
``mean`` scoring, SVD with combined biases)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from helpers import mlp_stats_of_both, random_tokens, tasks, tiny_model

from mi_core.errors import ConfigError
from mi_core.evaluation.next_token import evaluate_next_token
from mi_core.interventions.svd import svd_attention
from mi_core.methods.separability.run import SeparabilityConfig, run_separability
from mi_core.statistics.activations import collect_activation_stats
from mi_core.statistics.scoring import n_to_prune_at


def test_defaults_are_the_reports():
    config = SeparabilityConfig()
    assert (config.schedule, config.ff_scoring, config.attn_scoring) == ("total", "freq", "abs")
    # zero fills, no mean (the report's "mean offset"): the report calls it a "large bad effect"
    # on attention, and the authors' runs set do_attn_mean_offset False
    assert (config.ff_fill, config.attn_fill, config.steps) == ("zero", "zero", 20)
    shorthand = SeparabilityConfig(scoring="sqrt", fill="zero")
    assert (shorthand.ff_scoring, shorthand.attn_scoring) == ("sqrt", "sqrt")
    assert (shorthand.ff_fill, shorthand.attn_fill) == ("zero", "zero")
    assert SeparabilityConfig(ff_frac=0.1, attn_frac=0.1, steps=10).method == "freq+abs"
    assert SeparabilityConfig(ff_frac=0.1, steps=10).method == "freq"
    # total: 1/frac steps prune every unit; more would repeat the last step (evaluated again)
    with pytest.raises(ConfigError, match="10 steps prune every unit .* use --steps 10 or fewer"):
        SeparabilityConfig(ff_frac=0.1, steps=11)
    assert SeparabilityConfig(ff_frac=0.1, attn_frac=0.02, steps=50).steps == 50  # attn: 50
    assert SeparabilityConfig(ff_frac=0.1, steps=30, schedule="remaining").steps == 30
    for bad in (
        dict(schedule="geometric"),
        dict(attn_heads_per_step=2),  # needs attn_unit="head"
        dict(attn_fill="median"),
        dict(svd_combine_biases=True),  # needs svd
    ):
        with pytest.raises(ConfigError):
            SeparabilityConfig(**bad).validate()


def test_counts_per_step_by_schedule():
    # total: floor(step * frac * n + 1/2) cumulative, so 1/frac steps prune everything
    total = []
    left = 97
    for step in range(1, 21):
        k = n_to_prune_at(step, 97, left, 0.05, "total")
        left -= k
        total.append(97 - left)
    assert total[-1] == 97 and total[9] == math.floor(10 * 0.05 * 97 + 0.5) == 49
    assert total[:3] == [5, 10, 15]
    # remaining: a share of what is left, geometric: 20 steps of 5 % remove 64 %
    left = 1000
    for step in range(1, 21):
        left -= n_to_prune_at(step, 1000, left, 0.05, "remaining")
    assert 1000 - left == pytest.approx(1000 * (1 - 0.95**20), abs=3)


def test_total_schedule_reaches_exactly_all_units(llama):
    focus, cripple = tasks()
    config = SeparabilityConfig(steps=4, ff_frac=0.25, scoring="abs", batch_size=4)
    result = run_separability(llama, focus, cripple, config)
    n_ff = llama.cfg.n_layers * llama.cfg.d_mlp  # 96
    assert result.run_frame()["ff_pruned"].tolist() == [0, 24, 48, 72, 96]
    geometric = run_separability(
        llama, focus, cripple, SeparabilityConfig(**{**config.to_dict(), "schedule": "remaining"})
    )
    assert geometric.masks.n_ff_pruned < n_ff


def test_per_site_scoring_and_fills(llama):
    focus, cripple = tasks(seed=3)
    config = SeparabilityConfig(
        steps=1, ff_frac=0.25, attn_frac=0.25, batch_size=8, attn_fill="mean"
    )
    result = run_separability(llama, focus, cripple, config)
    f = collect_activation_stats(llama, focus.stats)
    c = collect_activation_stats(llama, cripple.stats)

    def top(ratio, frac):
        k = round(frac * ratio.numel())
        chosen = torch.zeros(ratio.numel(), dtype=torch.bool)
        chosen[ratio.flatten().topk(k).indices] = True
        return chosen

    eps = 1e-6
    freq_ratio = (c.mlp.freq + eps) / (f.mlp.freq + eps)
    abs_ratio = (c.attn.mean_abs + eps) / (f.attn.mean_abs + eps)
    ff_removed = result.masks.ff_step.flatten() == 1
    attn_removed = result.masks.attn_step.flatten() == 1
    # MLP neurons by positive-activation frequency, pre-out neurons by mean |x|
    assert torch.equal(attn_removed, top(abs_ratio, 0.25))
    abs_mlp = top((c.mlp.mean_abs + eps) / (f.mlp.mean_abs + eps), 0.25)
    freq_mlp = top(freq_ratio, 0.25)
    assert not torch.equal(abs_mlp, freq_mlp)  # the two scorings disagree on this model ...
    # ... and the run used freq (ties in freq are broken by position: compare the scores)
    assert freq_ratio.flatten()[ff_removed].min() >= freq_ratio.flatten()[~ff_removed].max()
    # fills: pre-out neurons get their focus mean, MLP neurons zero
    first = result.masks.attn_step == 1
    torch.testing.assert_close(
        result.masks.attn_fill[first], f.attn.mean.float()[first], atol=1e-6, rtol=0
    )
    assert (result.masks.ff_fill == 0).all()
    both = run_separability(
        llama, focus, cripple, SeparabilityConfig(**{**config.to_dict(), "ff_fill": "mean"})
    )
    assert both.masks.ff_fill[both.masks.ff_step == 1].abs().sum() > 0


def test_mean_diff_scoring_is_the_absolute_difference(llama):
    focus, cripple = tasks(seed=4)
    config = SeparabilityConfig(steps=1, ff_frac=0.25, scoring="mean_diff", batch_size=8)
    result = run_separability(llama, focus, cripple, config)
    f, c = mlp_stats_of_both(llama, focus, cripple)
    diff = (c.mlp.mean - f.mlp.mean).abs().flatten()
    removed = result.masks.ff_step.flatten() == 1
    assert diff[removed].min() >= diff[~removed].max()
    ratio = ((c.mlp.mean + 1e-6) / (f.mlp.mean + 1e-6)).flatten()
    signed = run_separability(
        llama, focus, cripple, SeparabilityConfig(**{**config.to_dict(), "scoring": "mean"})
    )
    assert not torch.equal(signed.masks.ff_step.flatten() == 1, removed)
    assert (
        ratio[signed.masks.ff_step.flatten() == 1].min()
        >= ratio[~(signed.masks.ff_step.flatten() == 1)].max()
    )


def test_heads_per_step_removes_a_fixed_count(llama):
    focus, cripple = tasks(seed=5)
    config = SeparabilityConfig(
        steps=3, ff_frac=0.0, attn_unit="head", attn_heads_per_step=3, batch_size=8
    )
    result = run_separability(llama, focus, cripple, config)
    assert result.run_frame()["heads_pruned"].tolist() == [0, 3, 6, 8]  # 8 heads in all


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_svd_with_combined_biases_keeps_outputs_and_zeroes_value_biases(kind):
    model, reference = tiny_model(kind), tiny_model(kind)
    with torch.no_grad():  # give the value biases something to move
        for block in model.blocks:
            attn = block.attn
            bias = attn._b_V if getattr(attn, "_b_V", None) is not None else attn.b_V
            bias.normal_(0, 0.5)
        reference.load_state_dict(model.state_dict())
    tokens = random_tokens(2, 12, seed=9)
    svd_attention(model, combine_biases=True)
    for block in model.blocks:
        attn = block.attn
        bias = attn._b_V if getattr(attn, "_b_V", None) is not None else attn.b_V
        assert bias.abs().max() == 0
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), reference(tokens), atol=1e-4, rtol=1e-4)
    plain = tiny_model(kind)
    plain.load_state_dict(reference.state_dict())
    svd_attention(plain)
    stats_a = collect_activation_stats(model, tokens, sites=("attn",)).attn.mean
    stats_b = collect_activation_stats(plain, tokens, sites=("attn",)).attn.mean
    assert not torch.allclose(stats_a, stats_b)  # the pre-out activations lost their bias
    base = evaluate_next_token(reference, tokens, skip_tokens=None)
    assert evaluate_next_token(model, tokens, skip_tokens=None)["loss"] == pytest.approx(
        base["loss"], rel=1e-4
    )


def test_text_loss_weighs_every_text_the_same(llama):
    tokens = random_tokens(2, 12, seed=11)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[0, 4:] = False  # a short text: 3 predictions, the other 11
    result = evaluate_next_token(llama, tokens, mask, skip_tokens=None)
    with torch.no_grad():
        logits = llama(tokens, attention_mask=mask.long())[:, :-1].double()
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none"
    ).reshape(2, -1)
    valid = mask[:, :-1] & mask[:, 1:]
    per_text = [float(loss[i][valid[i]].mean()) for i in range(2)]
    assert result["text_loss"] == pytest.approx(sum(per_text) / 2, rel=1e-5)
    assert result["loss"] == pytest.approx(float(loss[valid].mean()), rel=1e-5)
    assert result["text_loss"] != pytest.approx(result["loss"], rel=1e-3)


def test_shipped_report_config_runs_on_a_tiny_opt(tiny_checkpoints, tmp_path, capsys):
    """The report's OPT settings, with the model and data swapped for tiny local ones by flags."""
    import json

    from mi_core.cli import main
    from mi_core.methods.separability import shipped_separability_configs

    assert shipped_separability_configs() == ["opt-1.3b-pile-code", "smollm2-wikitext-python"]
    rng = torch.Generator().manual_seed(0)
    words = [f"w{i}" for i in range(60)]

    def corpus(path, low, high):
        rows = []
        for _ in range(40):
            ids = torch.randint(low, high, (40,), generator=rng).tolist()
            rows.append(json.dumps({"text": " ".join(words[i] for i in ids)}))
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
        return str(path)

    out = tmp_path / "run"
    args = [
        "separability", "--config", "opt-1.3b-pile-code",
        "--model", str(tiny_checkpoints["opt-lm"]),
        "--focus", corpus(tmp_path / "pile.jsonl", 0, 30),
        "--cripple", corpus(tmp_path / "code.jsonl", 30, 60),
        "--steps", "2", "--tokens", "512", "--eval-tokens", "200", "--text-tokens", "64",
        "--window", "32", "--device", "cpu", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    config = summary["config"]
    # the report's settings came from the shipped file ...
    assert (config["ff_scoring"], config["attn_scoring"]) == ("freq", "abs")
    assert (config["schedule"], config["eval_protocol"], config["attn_fill"]) == (
        "total",
        "texts",
        "zero",
    )
    assert (config["ff_frac"], config["attn_frac"], config["random_baseline"]) == (0.05, 0.02, True)
    # ... and the flags overrode the rest
    assert config["steps"] == 2 and summary["text_tokens"] == 64
    frame = pd.read_csv(out / "trajectory.csv")
    ours = frame[frame["method"] == "freq+abs"].sort_values("step")
    n_ff = 3 * 64  # tiny OPT: 3 layers x d_mlp 64
    assert ours["ff_pruned"].tolist() == [0, round(0.05 * n_ff), round(0.1 * n_ff)]
    assert set(frame["method"]) == {"freq+abs", "random"}
    # a config that does not exist, or with an unknown key, is one clear line
    capsys.readouterr()
    assert main(["separability", "--config", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "shipped separability configs: opt-1.3b-pile-code" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"ff_fraction": 0.1}))
    assert main(["separability", "--config", str(bad), "--out", str(tmp_path / "y")]) == 2
    assert "unknown key(s) ['ff_fraction']" in capsys.readouterr().err


def test_shipped_smollm2_config_is_valid():
    from mi_core.cli import build_parser
    from mi_core.cli.separability import config_from_args
    from mi_core.methods.separability import load_separability_config

    args = build_parser().parse_args(["separability", "--config", "smollm2-wikitext-python"])
    config = config_from_args(args)
    assert (config.model, config.focus, config.cripple) == (
        "smollm2",
        "text:wikitext",
        "text:python",
    )
    assert config == load_separability_config("smollm2-wikitext-python")
    assert (config.ff_scoring, config.tokens, config.random_baseline) == ("abs", 20000, True)
    # a flag given on the command line wins over the file
    args = build_parser().parse_args(
        ["separability", "--config", "smollm2-wikitext-python", "--steps", "3"]
    )
    assert config_from_args(args).steps == 3


def test_statistics_on_correctly_predicted_tokens_only():
    """In float64, so that the streaming mean equals the mean taken by hand to 1e-8 on any CPU
    (tests/README.md)."""
    from mi_core.statistics.activations import correct_positions

    llama = tiny_model("llama").double()
    tokens = random_tokens(3, 10, seed=12)
    with torch.no_grad():
        logits = llama(tokens)
    # by hand: position i counts when token i+1 ranks below k among position i's logits
    for k in (1, 10):
        expected = torch.zeros_like(tokens, dtype=torch.bool)
        for b in range(3):
            for i in range(9):
                rank = int((logits[b, i] > logits[b, i, tokens[b, i + 1]]).sum())
                expected[b, i] = rank < k
        assert torch.equal(correct_positions(logits, tokens, k), expected)
    chosen = correct_positions(logits, tokens, 10)
    assert chosen.any() and not chosen.all() and not chosen[:, -1].any()
    only = collect_activation_stats(llama, tokens, correct_top_k=10, sites=("mlp",))
    assert only.mlp.count[0] == int(chosen.sum())
    # the same numbers as collecting over exactly those positions by hand
    post = []
    llama.run_with_hooks(
        tokens,
        fwd_hooks=[("blocks.1.mlp.hook_post", lambda x, hook: post.append(x.detach()))],
    )
    picked = post[0][chosen]
    assert picked.dtype == torch.float64
    torch.testing.assert_close(only.mlp.mean[1], picked.mean(0), rtol=1e-6, atol=1e-8)
    every = collect_activation_stats(llama, tokens, sites=("mlp",))
    assert every.mlp.count[0] == tokens.numel()
    assert SeparabilityConfig(stats_correct_top_k=10).stats_correct_top_k == 10
    with pytest.raises(ConfigError):
        SeparabilityConfig(stats_correct_top_k=-1).validate()


def test_summary_judges_the_reports_finding():
    from mi_core.methods.separability.run import separability_findings

    def summary(area, rand=None, mode="cripple", cripple_end=0.1):
        out = {"mode": mode, "steps_done": 20, "areas": {"top1": {"area": area}}}
        out["end"] = {"focus_top1": 0.8, "cripple_top1": cripple_end}
        if rand is not None:
            out["random_areas"] = {"top1": {"area": rand}}
        return out

    def verdict(*args, **kwargs):
        return separability_findings(summary(*args, **kwargs))[0]["verdict"]

    assert verdict(1.70, 1.10) == "reproduced"
    assert verdict(1.60, 1.10) == "not reproduced"
    assert verdict(1.70, 1.80) == "not reproduced"
    assert verdict(float("nan")) == "not measurable here"
    # the wrong direction: the focus data collapsed first (|1 - area| = 88 % is no separation)
    assert verdict(0.12, 1.0) == "not reproduced"
    # focus mode: x is the focus data's performance, so a separation has an area below 1
    assert verdict(0.30, 0.90, mode="focus") == "reproduced"
    assert verdict(1.70, 1.10, mode="focus") == "not reproduced"
    # a run that stopped early: the closing line to (0, 0) would decide the area
    assert verdict(1.75, 1.10, cripple_end=0.9) == "not measurable here"
    text = separability_findings(summary(1.70, 1.10))[0]["this run"]
    assert "+70.0 %" in text and "random pruning: +10.0 %" in text
    assert (
        "after 20 steps the cripple top-1 is at 10 % of its start, the focus top-1 at 80 %" in text
    )
    # a summary of an older mi_core (no top-1 area, or no mode) is refused in one line
    older = "separability summary of an older mi_core .*: re-run mi-core separability"
    unsigned = {**summary(1.70), "areas": {"top1": {"separability_pct": 70.0}}}
    with pytest.raises(ConfigError, match=older):
        separability_findings(unsigned)
    with pytest.raises(ConfigError, match=older):
        separability_findings({k: v for k, v in summary(1.70).items() if k != "mode"})


def test_bad_data_and_unreplaceable_outputs_are_refused_before_the_model_loads(
    tmp_path, monkeypatch, caplog, tiny_checkpoints
):
    """A missing --cripple file was found after the model had loaded (35 s for SmolLM2, a full
    1.3B load for the OPT config), a read-only output after the first step."""
    import json

    import mi_core.models
    from mi_core.errors import DataError, OutputError
    from mi_core.methods.separability.job import _task, run_separability_job

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(mi_core.models, "load_model", no_load)
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"text": f"word {i} " * 30}) + "\n" for i in range(20)))
    base = {"model": str(tiny_checkpoints["opt-lm"]), "focus": str(text),
            "cripple": str(tmp_path / "missing.jsonl"), "out": str(tmp_path / "a")}  # fmt: skip
    with pytest.raises(DataError, match="missing.jsonl not found"):
        run_separability_job(SeparabilityConfig.from_dict(base))
    out = tmp_path / "b"
    out.mkdir()
    (out / "trajectory.csv").write_text("old\n")
    (out / "trajectory.csv").chmod(0o444)
    with pytest.raises(OutputError, match="trajectory.csv: the file is read-only"):
        run_separability_job(SeparabilityConfig.from_dict({**base, "cripple": str(text),
                                                           "out": str(out)}))  # fmt: skip
    # the texts protocol says when the held-out texts hold fewer predictions than asked
    texts = {"cripple": str(text), "window": 8, "eval_protocol": "texts", "text_tokens": 16}
    config = SeparabilityConfig.from_dict({**base, **texts})
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoints["opt-lm"])
    with caplog.at_level("WARNING", logger="mi_core.methods.separability.job"):
        task = _task(tokenizer, str(text), config, 5000)
    held = int(task.heldout_mask.sum()) - task.heldout_mask.shape[0]
    assert held < 5000 and f"hold {held} predictions" in caplog.text and "5000 asked" in caplog.text
