"""On the real SmolLM2-135M: pruning code-heavy MLP neurons cripples code more than English text."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

WINDOW = 128
N_STATS = 8  # windows of statistics per data set (1,024 tokens)
N_HELDOUT = 8  # held-out windows scored per data set


@pytest.fixture(scope="module")
def code_vs_text(smollm2, data_dir):
    from mi_core.data import token_windows
    from mi_core.methods.separability.run import TaskTokens

    def task(spec):
        return TaskTokens(
            spec,
            token_windows(smollm2.tokenizer, spec, window=WINDOW, n_windows=N_STATS, split="stats"),
            token_windows(
                smollm2.tokenizer, spec, window=WINDOW, n_windows=N_HELDOUT, split="heldout"
            ),
        )

    return task("text:wikitext"), task("text:python")


def test_ff_pruning_by_abs_cripples_code_more_than_text_and_than_random(smollm2, code_vs_text):
    from mi_core.methods.separability.run import SeparabilityConfig, run_separability

    focus, cripple = code_vs_text
    config = SeparabilityConfig(
        steps=2,
        ff_frac=0.05,
        scoring="abs",
        random_baseline=True,
        batch_size=8,
        schedule="remaining",
    )
    result = run_separability(smollm2, focus, cripple, config)
    ours, rand = result.run_frame(), result.run_frame("random")
    assert ours["ff_pruned"].tolist() == [0, 2304, 4493]  # 5 % of 46,080, then of the rest

    def drop(frame, role):
        top1 = frame[f"{role}_top1"].to_numpy()
        return (top1[0] - top1[-1]) / top1[0]

    code, text, random_code = drop(ours, "cripple"), drop(ours, "focus"), drop(rand, "cripple")
    assert ours["cripple_top1"].iloc[0] > 0.3 and ours["focus_top1"].iloc[0] > 0.2  # a real LM
    assert code > text + 0.2, (code, text)
    assert code > random_code + 0.2, (code, random_code)
    areas = result.summary()["areas"]
    assert areas["top1"]["area"] > 1.3  # cripple mode: separation moves the area towards 2
