"""The authors' pruning recipe (princeton-nlp/Heuristic-Core) against CoFi's, option by option.

Each option of :class:`~mi_core.pruning.PruneConfig` that separates the ``paper`` profile from
``cofi`` has a test here that fails under the other setting.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from mi_core.errors import ConfigError
from mi_core.models import load_model
from mi_core.models.dropout import DropoutRates, dropout_hooks, train_dropout
from mi_core.pruning import (
    HardConcrete,
    LagrangianController,
    make_prune_config,
    pruning_optimizer,
)
from mi_core.pruning.discretize import (
    THRESHOLD_GRID,
    discretize,
    reference_binary_mask,
    reference_soft_mask,
)
from mi_core.pruning.hard_concrete import BETA, LIMIT_LEFT, LIMIT_RIGHT, hard_concrete_prob_nonzero
from mi_core.pruning.lagrangian import expected_sparsity, sampled_sparsity
from mi_core.pruning.profiles import COFI_MECHANICS, PAPER_MECHANICS
from mi_core.pruning.schedule import lr_factor

pytestmark = pytest.mark.usefixtures("one_thread")


# --------------------------------------------------------------------------- the profiles
def test_paper_profile_is_the_authors_recipe_and_cofi_is_the_earlier_one():
    paper = make_prune_config("paper", 0.5, 1)
    assert (paper.steps, paper.warmup_steps, paper.effective_batch_size) == (9300, 9000, 128)
    assert paper.sparsity_estimate == "sampled"
    assert (paper.log_alpha_init, paper.log_alpha_init_std) == (10.0, 0.01)
    assert (paper.weight_decay, paper.lr_warmup_steps, paper.lr_schedule) == (0.01, 200, "linear")
    assert (paper.max_grad_norm, paper.dropout, paper.discretize) == (1.0, True, "reference")
    cofi = make_prune_config("cofi", 0.5, 1)
    assert (cofi.steps, cofi.warmup_steps, cofi.lr_log_alpha) == (9300, 9000, 0.1)
    assert cofi.sparsity_estimate == "expected" and cofi.log_alpha_init == pytest.approx(
        math.log(99.0)
    )
    assert (cofi.log_alpha_init_std, cofi.weight_decay, cofi.lr_schedule) == (0.0, 0.0, "constant")
    assert (cofi.max_grad_norm, cofi.dropout, cofi.discretize) == (0.0, False, "exact")
    # the two profiles differ in exactly the mechanics, each switchable alone
    assert set(PAPER_MECHANICS) == set(COFI_MECHANICS)
    for name, value in COFI_MECHANICS.items():
        one = make_prune_config("paper", 0.5, 1, **{name: value})
        assert getattr(one, name) == value and one.sparsity_estimate == (
            value if name == "sparsity_estimate" else "sampled"
        )


def test_quick_profile_is_the_paper_recipe_on_a_short_schedule():
    quick = make_prune_config("quick", 0.5, 1)
    paper = make_prune_config("paper", 0.5, 1)
    for name in PAPER_MECHANICS:
        if name not in ("log_alpha_init", "lr_warmup_steps"):
            assert getattr(quick, name) == getattr(paper, name), name
    assert quick.steps < 1000 and quick.grad_accumulation == 1
    # it starts where the paper's weight decay alone (no gradient flows from 10) brings the gates
    # as the paper's 50 % target passes 0.077 (step 1,380): 10 * prod(1 - lr_k * wd)
    decayed = 10.0
    for step in range(1380):
        decayed *= 1 - 0.1 * lr_factor(step, 200, 9300) * 0.01
    assert quick.log_alpha_init == pytest.approx(decayed, abs=0.02)
    assert (quick.log_alpha_init_std, quick.weight_decay) == (0.01, 0.01)
    assert quick.lr_warmup_steps == round(quick.steps * 200 / 9300)
    assert quick.warmup_steps / quick.steps == pytest.approx(9000 / 9300, abs=0.01)
    # a steps override keeps both warm-ups' share of the run
    short = make_prune_config("paper", 0.5, 1, steps=930)
    assert (short.warmup_steps, short.lr_warmup_steps) == (900, 20)
    with pytest.raises(ConfigError, match="lr_warmup_steps"):
        make_prune_config("paper", 0.5, 1, steps=100, lr_warmup_steps=101)
    for bad in (
        {"sparsity_estimate": "median"},
        {"discretize": "round"},
        {"lr_schedule": "cosine"},
        {"dropout": 1},
        {"weight_decay": -0.1},
        {"max_grad_norm": -1.0},
    ):
        with pytest.raises(ConfigError):
            make_prune_config("paper", 0.5, 1, **bad)


# ------------------------------------------------------------------- sparsity in the penalty
def test_sampled_sparsity_counts_the_sample_not_the_expectation():
    z = torch.tensor([1.0, 0.0, 0.5, 1.0])
    assert sampled_sparsity(z).item() == pytest.approx(1 - 2.5 / 4)
    weights = torch.tensor([1.0, 3.0, 0.0, 1.0])
    assert sampled_sparsity(z, weights).item() == pytest.approx(1 - 2.0 / 5)
    # at log_alpha = 0 the expected L0 counts a gate 17 % removed; a sample, 50 % on average
    log_alpha = torch.zeros(200_000)
    gates = HardConcrete(log_alpha.shape, init_mean=0.0)
    sample = gates.sample(torch.Generator().manual_seed(0))
    assert sampled_sparsity(sample).item() == pytest.approx(0.5, abs=0.005)
    assert expected_sparsity(gates.prob_nonzero()).item() == pytest.approx(0.168, abs=0.001)
    # and its gradient reaches log_alpha through the fractional samples only
    sampled_sparsity(sample).backward()
    grad = gates.log_alpha.grad
    fractional = (sample > 0) & (sample < 1)
    assert (grad[fractional] < 0).all() and (grad[~fractional] == 0).all()


# ------------------------------------------------------------------------- initialisation
def test_log_alpha_is_drawn_from_the_seed_around_ten():
    def gates(seed):
        return HardConcrete(
            10_000, init_mean=10.0, init_std=0.01, generator=torch.Generator().manual_seed(seed)
        ).log_alpha.detach()

    a, b, c = gates(1), gates(1), gates(2)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.mean().item() == pytest.approx(10.0, abs=0.001)
    assert a.std().item() == pytest.approx(0.01, rel=0.05)
    assert torch.equal(HardConcrete(5).log_alpha.detach(), torch.full((5,), math.log(99.0)))


# --------------------------------------------------------------- optimiser and lr schedule
def test_lr_schedule_warms_up_then_decays_linearly_to_zero():
    assert [lr_factor(s, 4, 12) for s in (0, 1, 4, 8, 12)] == [0.0, 0.25, 1.0, 0.5, 0.0]
    assert lr_factor(5, 0, 10) == 0.5
    assert all(lr_factor(s, 4, 12, "constant") == 1.0 for s in range(13))
    with pytest.raises(ConfigError):
        lr_factor(1, 2, 10, "cosine")


@pytest.mark.parametrize("weight_decay", [0.01, 0.0])
def test_weight_decay_pulls_log_alpha_down_by_hand_computation(weight_decay):
    """With no gradient (every sample exactly 1 at log_alpha 10), only decay moves log_alpha:
    after k steps it is ``10 * prod_i (1 - lr_i * wd)`` with the scheduled ``lr_i``."""
    gates = HardConcrete(6, init_mean=10.0)
    controller = LagrangianController()
    with torch.no_grad():
        controller.lambda_1.fill_(2.0)
    optimizer = pruning_optimizer(gates.parameters(), controller, 0.1, 1.0, weight_decay)
    bases = [g["lr"] for g in optimizer.param_groups]
    expected_alpha, expected_lambda = 10.0, 2.0
    for step in range(7):
        factor = lr_factor(step, 3, 20)
        for group, base in zip(optimizer.param_groups, bases, strict=True):
            group["lr"] = base * factor
        for p in (gates.log_alpha, *controller.parameters()):
            p.grad = torch.zeros_like(p)
        optimizer.step()
        expected_alpha *= 1 - 0.1 * factor * weight_decay
        expected_lambda *= 1 - 1.0 * factor * weight_decay
    assert torch.allclose(gates.log_alpha.detach(), torch.full((6,), expected_alpha), atol=1e-6)
    assert controller.lambda_1.item() == pytest.approx(expected_lambda, abs=1e-6)
    if weight_decay:
        assert expected_alpha < 10.0 - 1e-3 and expected_lambda < 2.0 - 1e-2
    else:
        assert expected_alpha == 10.0


# -------------------------------------------------------------------------- discretisation
def test_reference_discretisation_by_hand():
    """2 layers x 2 heads: per-module rounding of the expected zeros, then the threshold grid."""
    log_alpha = torch.tensor([3.0, -4.0, 0.5, 0.2, -3.0, 4.0])  # L0.H0 L0.H1 L1.H0 L1.H1 MLPs
    p_zero = 1 - hard_concrete_prob_nonzero(log_alpha)
    soft = torch.sigmoid(log_alpha / BETA * 0.8)
    # layer 0's heads expect round(p0 + p1) zeros, layer 1's round(p2 + p3), each MLP round(p)
    assert round(float(p_zero[0] + p_zero[1])) == 1
    assert round(float(p_zero[2] + p_zero[3])) == 0
    assert [round(float(p)) for p in p_zero[4:]] == [1, 0]
    expected_soft = soft.clone()
    expected_soft[[1, 4]] = 0.0
    assert torch.allclose(reference_soft_mask(log_alpha, 2, 2), expected_soft)
    # target 0.5 (3 of 6): soft values ~[0.97, 0, 0.65, 0.56, 0, 0.99] -> threshold 0.6 removes 3
    keep, achieved = reference_binary_mask(log_alpha, 2, 2, 0.5)
    assert keep.tolist() == [True, False, True, False, False, True]
    assert achieved.by_count == pytest.approx(0.5)
    assert achieved.threshold in THRESHOLD_GRID and 0.56 < achieved.threshold < 0.65
    # the exact rule removes the lowest log_alpha instead: L0.H1, L1.MLP... here L1.H1
    exact, exact_achieved = discretize(log_alpha, 2, 2, 0.5, "exact")
    assert exact.tolist() == [True, False, True, False, False, True]
    assert exact_achieved.threshold is None
    # where the rules disagree: the reference rule cannot reach 1/6 (only 0 or 2/6 at thr 0)
    keep, achieved = reference_binary_mask(log_alpha, 2, 2, 1 / 6)
    exact, _ = discretize(log_alpha, 2, 2, 1 / 6, "exact")
    assert (~exact).sum() == 1 and (~keep).sum() == 2 and achieved.threshold == 0.0


# ------------------------------------------------------------------------------- dropout
@pytest.mark.parametrize("kind", ["bert-cls", "roberta-cls", "gpt2-cls"])
def test_dropout_hooks_equal_hugging_face_train_mode(tiny_checkpoints, kind):
    path = tiny_checkpoints[kind]
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, attn_implementation="eager"
    )
    model = load_model(path, task="mnli")
    assert model.dropout_rates == DropoutRates.from_hf_config(hf.config)
    assert model.dropout_rates.any
    batch = dict(
        model.tokenizer(
            ["a man is here today", "the cat sat on the mat and then it left"],
            ["someone is here", "a cat"],
            return_tensors="pt",
            padding=True,
        )
    )
    if kind != "bert-cls":
        batch.pop("token_type_ids", None)
    hf.train()
    torch.manual_seed(5)
    expected = hf(**batch).logits
    with torch.no_grad(), train_dropout(model):
        torch.manual_seed(5)
        got = model(**batch)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    with torch.no_grad():
        hf.eval()
        assert not torch.allclose(got, hf(**batch).logits, atol=1e-3)
        assert torch.allclose(model(**batch), hf(**batch).logits, atol=1e-4)  # hooks removed
    with train_dropout(model, enabled=False):
        assert not model.hook_dict["blocks.0.hook_resid_pre"]._forward_hooks
    assert len(dropout_hooks(model, DropoutRates())) == 0


def test_the_pruning_package_example_runs_the_paper_recipe():
    """The loop in ``mi_core.pruning``'s docstring runs as written (it had taught the cofi
    mechanics: expected L0, no weight decay, exact top-k) and its gates decay as the paper's."""
    import textwrap

    import mi_core.pruning as pruning

    doc = pruning.__doc__
    code = textwrap.dedent(doc[doc.index("::") + 2 : doc.index("The ``cofi``")])
    assert 'make_prune_config("paper"' in code and "sampled_sparsity(z)" in code
    code = code.replace("seed=1)", "seed=1, steps=40, lr_warmup_steps=4)")
    names = {name: getattr(pruning, name) for name in pruning.__all__}
    names |= {"n_layers": 2, "n_heads": 3, "task_loss": lambda heads, mlps: 0.0 * heads.sum()}
    exec(code, names)
    assert names["keep"].shape == (2 * 3 + 2,)
    cfg = names["cfg"]
    assert (cfg.weight_decay, cfg.discretize, cfg.sparsity_estimate) == (
        0.01,
        "reference",
        "sampled",
    )
    assert float(names["gates"].log_alpha.detach().mean()) < cfg.log_alpha_init  # decayed


@pytest.mark.parametrize(("low", "edge", "removed"), [(77, 2, 77), (76, 4, 76)])
def test_the_reference_threshold_breaks_ties_towards_the_denser_mask(low, edge, removed):
    """156 components (BERT-base), target 0.5 (78): thresholds that remove 77 and 79 (or 76 and
    80) lie equally far from it, and the denser mask wins both ties; float32 means had let the
    sparser one win the first."""
    from mi_core.pruning.discretize import reference_binary_mask

    log_alpha = torch.full((156,), 3.0)
    log_alpha[:low] = -1.0
    log_alpha[low : low + edge] = -0.05
    keep, achieved = reference_binary_mask(log_alpha, 12, 12, 0.5)
    assert int((~keep).sum()) == removed


def test_the_reference_discretisation_reads_the_run_s_temperature():
    """beta (--beta) sets the expected zeros of each module as it sets the samples: 12 heads at
    log_alpha -0.5 expect 3.4 zeros at beta 2/3 and 4.1 at beta 1/2 (rounded: 3 and 4)."""
    from mi_core.pruning.discretize import reference_soft_mask

    log_alpha = torch.cat([torch.full((12,), -0.5), torch.full((1,), 3.0)])
    assert int((reference_soft_mask(log_alpha, 1, 12) == 0).sum()) == 3
    assert int((reference_soft_mask(log_alpha, 1, 12, beta=0.5) == 0).sum()) == 4


def test_the_reference_discretisation_breaks_ties_as_the_authors_topk_does():
    """12 heads tied at log_alpha -1 expect 4.3 zeros: the authors' ``torch.topk(largest=False)``
    picks which 4 go, not the 4 lowest indices (a stable sort's pick, mi_core's before)."""
    from mi_core.pruning.discretize import reference_soft_mask

    log_alpha = torch.cat([torch.full((12,), -1.0), torch.full((1,), 3.0)])
    soft = torch.sigmoid(log_alpha[:12].double() / BETA * 0.8)
    authors = sorted(torch.topk(soft, 4, largest=False).indices.tolist())
    assert authors != [0, 1, 2, 3]  # the tie is one where the two picks differ
    zeros = (reference_soft_mask(log_alpha, 1, 12)[:12] == 0).nonzero().flatten().tolist()
    assert zeros == authors


def test_the_reference_expected_zeros_are_clamped_as_the_authors():
    """The authors clamp each P(z = 0) to [1e-6, 1 - 1e-6] before a layer's sum: 11 open heads
    (P ~ 4e-10 each) add 1.1e-5, which rounds a layer whose last head has P(z = 0) = 0.499995
    to one zero (0.500006) where the unclamped sum (0.499995) rounds to none."""
    from mi_core.pruning.discretize import reference_soft_mask

    shift = BETA * math.log(-LIMIT_LEFT / LIMIT_RIGHT)  # P(z = 0) = sigmoid(shift - log_alpha)
    last = shift - math.log(0.499995 / (1 - 0.499995))
    log_alpha = torch.tensor([20.0] * 11 + [last, 20.0], dtype=torch.float64)
    p_zero = 1 - hard_concrete_prob_nonzero(log_alpha[:12])
    assert float(p_zero.sum()) < 0.5 < float(p_zero.clamp(1e-6, 1 - 1e-6).sum())
    zeros = (reference_soft_mask(log_alpha, 1, 12)[:12] == 0).nonzero().flatten().tolist()
    assert zeros == [11]


@pytest.mark.parametrize("profile", ["paper", "cofi"])
def test_a_run_s_gates_in_eval_mode_give_its_subnetwork(profile):
    """Louizos' deterministic gate (a plain HardConcrete's eval value) lies up to 0.44 from the
    paper profile's gates; a run's gates (make_gates) in eval mode give the subnetwork the run
    discretises, probes and reports, by its profile's rule."""
    from mi_core.pruning import make_gates
    from mi_core.pruning.hard_concrete import deterministic_hard_concrete

    cfg = make_prune_config(profile, 0.5, seed=3)
    gates = make_gates(cfg, 2, 4)
    with torch.no_grad():
        gates.log_alpha.copy_(torch.tensor([3.0, -2, 0.4, 1, -0.3, 2, 0.1, -1, 0.8, -0.2]))
    keep, _ = discretize(gates.log_alpha, 2, 4, 0.5, cfg.discretize, beta=cfg.beta)
    gates.eval()
    assert torch.equal(gates(), keep.float())
    louizos = deterministic_hard_concrete(gates.log_alpha)
    assert (louizos - keep.float()).abs().max() > 0.3  # what .eval() gave before
    assert torch.equal(
        HardConcrete(10).eval()(), deterministic_hard_concrete(torch.full((10,), math.log(99.0)))
    )
    gates.train()
    assert not torch.equal(gates(torch.Generator().manual_seed(0)), keep.float())


def test_a_schedule_too_short_to_move_the_gates_is_named_before_the_run(tiny, train, caplog):
    """``quick`` with 20 steps removed 0 of 78 components, after the run and with a warning
    about another quantity. A gate moves at most about lr_log_alpha a step (Adam): 20 steps of
    the quick schedule move it 1.05, from 3 to 1.95, short of -1.6 where it is zero half the
    time; the run says so before its first step, and a schedule long enough says nothing."""
    from mi_core.pruning import prune
    from mi_core.pruning.profiles import gate_travel, unreachable_target

    short = make_prune_config("quick", 0.5, seed=1, steps=20)
    assert gate_travel(short) == pytest.approx(
        0.1 * sum(lr_factor(t, 0, 20, "linear") for t in range(20))
    )
    assert "cannot reach its target in 20 steps" in unreachable_target(short)
    assert "give about 91 steps" in unreachable_target(short)  # 0.1 x (91 + 1) / 2 = 4.6
    assert unreachable_target(make_prune_config("quick", 0.5, seed=1)) is None
    assert unreachable_target(make_prune_config("quick", 0.5, seed=1, steps=100)) is None
    assert "ranked by gates that barely moved" in unreachable_target(
        make_prune_config("cofi", 0.5, seed=1, steps=20)
    )
    steps = []
    with caplog.at_level("WARNING", logger="mi_core.pruning.run"):
        prune(tiny, train.subset(list(range(8))), None,
              make_prune_config("quick", 0.5, seed=1, steps=2, batch_size=4, fill="zero"),
              progress=False, callback=lambda state, row: steps.append(row["step"]))  # fmt: skip
    warned = [r for r in caplog.records if "cannot reach its target" in r.getMessage()]
    assert len(warned) == 1 and steps  # one warning, then the steps
