"""Learned separability (:mod:`mi_core.methods.separability.learned`): neuron masks trained to
keep the focus text and lose the cripple text, removing as many units a step as the statistics
method, resuming after a kill to the same trajectory."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from helpers import tasks

from mi_core.errors import ConfigError
from mi_core.methods.separability.learned import learned_unit_counts
from mi_core.methods.separability.run import SeparabilityConfig, run_separability


def _config(**changes):
    values = dict(steps=3, ff_frac=0.1, attn_frac=0.05, scoring="abs", batch_size=4,
                  selection="both", learn_steps=4, learn_lr=0.8, random_baseline=True)  # fmt: skip
    return SeparabilityConfig(**{**values, **changes})


def test_the_learned_run_removes_what_the_statistics_remove_and_resumes(llama, tmp_path):
    focus, cripple = tasks()
    config = _config()
    whole = run_separability(llama, focus, cripple, config, state_path=tmp_path / "a" / "s")
    frame = whole.trajectory
    stats, learned = whole.run_frame("abs"), whole.run_frame("learned")
    assert sorted(frame["method"].unique()) == ["abs", "learned", "random"]
    removed = lambda f: (f["ff_pruned"] + f["attn_pruned"]).tolist()  # noqa: E731
    assert removed(learned) == removed(stats) == removed(whole.run_frame("random"))
    cfg = llama.cfg
    n_ff, n_attn = cfg.n_layers * cfg.d_mlp, cfg.n_layers * cfg.n_heads * cfg.d_head
    assert removed(learned)[1:] == learned_unit_counts(config, n_ff, n_attn)
    assert whole.learned_masks is not None and not whole.learned_masks == whole.masks
    assert "learned_areas" in whole.summary()
    # the masks were trained: the learned run is neither the statistics' nor random pruning
    assert learned["cripple_loss"].tolist() != stats["cripple_loss"].tolist()

    # killed after its second learned step: the re-run goes on to the same trajectory
    state = tmp_path / "b" / "s"
    seen = []

    def kill(row):
        seen.append(row)
        if row["method"] == "learned" and row["step"] == 2:
            raise KeyboardInterrupt  # a kill

    with pytest.raises(KeyboardInterrupt):
        run_separability(llama, focus, cripple, config, state_path=state, on_step=kill)
    again = run_separability(llama, focus, cripple, config, state_path=state)
    pd.testing.assert_frame_equal(again.trajectory, frame)
    assert again.learned_masks == whole.learned_masks


def test_learned_only_and_its_refusals(llama):
    focus, cripple = tasks()
    only = run_separability(llama, focus, cripple, _config(selection="learned",
                                                          random_baseline=False))  # fmt: skip
    assert set(only.trajectory["method"]) == {"learned"} and only.method == "learned"
    assert only.masks is only.learned_masks
    assert only.summary()["pruned"]["ff_neurons"] == only.learned_masks.n_ff_pruned
    for changes in (dict(attn_frac=0.0), dict(attn_unit="head"), dict(learn_steps=0)):
        with pytest.raises(ConfigError):
            _config(**changes).validate()
    # another cripple term is another run: it learns other masks
    capped = run_separability(llama, focus, cripple, _config(selection="learned",
                              random_baseline=False, cripple_term="capped"))  # fmt: skip
    assert not torch.equal(capped.masks.ff_step, only.masks.ff_step) or not torch.equal(
        capped.masks.attn_step, only.masks.attn_step
    )
