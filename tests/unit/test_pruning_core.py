"""Unit tests of the model-independent L0 pruning core (mi_core.pruning)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from mi_core.errors import ConfigError, InterventionError, TrainingError
from mi_core.pruning import (
    HardConcrete,
    LagrangianController,
    PruneConfig,
    expected_sparsity,
    make_prune_config,
    pruning_optimizer,
    target_sparsity_at,
    unflatten_components,
)
from mi_core.pruning.discretize import binary_mask_from_log_alpha, flatten_components, mask_sparsity
from mi_core.pruning.hard_concrete import (
    BETA,
    deterministic_hard_concrete,
    hard_concrete_prob_nonzero,
    initial_log_alpha,
    sample_hard_concrete,
)
from mi_core.pruning.lagrangian import component_weights
from mi_core.pruning.profiles import parse_seed_spec, parse_sparsities
from mi_core.pruning.schedule import paper_schedule

# --- hard concrete -------------------------------------------------------------------------------


def test_initial_gates_are_on():
    gates = HardConcrete((3, 4))
    assert gates.log_alpha.shape == (3, 4)
    assert torch.allclose(gates.log_alpha, torch.full((3, 4), math.log(99.0)))
    gates.eval()
    assert torch.equal(gates(), torch.ones(3, 4))
    assert gates.prob_nonzero().min() > 0.99
    assert gates.expected_l0().item() == pytest.approx(12.0, abs=0.05)
    gates.train()
    samples = torch.stack([gates.sample() for _ in range(2000)])
    assert (samples == 1.0).float().mean() > 0.9


def test_samples_lie_in_unit_interval_with_exact_zeros_and_ones():
    log_alpha = torch.zeros(100_000)
    z = sample_hard_concrete(log_alpha, generator=torch.Generator().manual_seed(0))
    assert z.min() >= 0.0 and z.max() <= 1.0
    frac_zero = (z == 0).float().mean().item()
    frac_one = (z == 1).float().mean().item()
    # At log_alpha = 0: P(z = 0) = P(z = 1) = sigmoid(-beta * log 11) ~ 0.168.
    expected = 1.0 / (1.0 + math.exp(BETA * math.log(11.0)))
    assert frac_zero == pytest.approx(expected, abs=0.01)
    assert frac_one == pytest.approx(expected, abs=0.01)
    assert 0.6 < 1 - frac_zero - frac_one < 0.7


def test_a_sample_is_the_transform_of_its_generators_uniform_draw():
    """The noise is the generator's own draw (on the generator's device, moved to the gates'),
    so one seed gives one sample whatever device the gates are on; by hand at u = 0.5 the
    gate is the stretched sigmoid(log_alpha / beta)."""
    from mi_core.pruning.hard_concrete import LIMIT_LEFT, LIMIT_RIGHT, hard_concrete_from_uniform

    log_alpha = torch.linspace(-4.0, 4.0, 50)
    z = sample_hard_concrete(log_alpha, generator=torch.Generator().manual_seed(7))
    u = torch.rand(50, generator=torch.Generator().manual_seed(7))
    assert torch.equal(z, hard_concrete_from_uniform(log_alpha, u))
    half = hard_concrete_from_uniform(torch.tensor([0.3]), torch.tensor([0.5])).item()
    stretched = (LIMIT_RIGHT - LIMIT_LEFT) / (1 + math.exp(-0.3 / BETA)) + LIMIT_LEFT
    assert half == pytest.approx(stretched, rel=1e-6)


@pytest.mark.parametrize("log_alpha", [-3.0, -1.0, 0.0, 1.5, 3.0])
def test_empirical_nonzero_rate_matches_prob_nonzero(log_alpha):
    la = torch.full((200_000,), log_alpha)
    z = sample_hard_concrete(la, generator=torch.Generator().manual_seed(1))
    empirical = (z > 0).float().mean().item()
    assert empirical == pytest.approx(hard_concrete_prob_nonzero(la)[0].item(), abs=0.005)


def test_prob_nonzero_known_value():
    # sigmoid(0 - (2/3) * log(0.1 / 1.1)) = sigmoid((2/3) * log 11)
    value = hard_concrete_prob_nonzero(torch.tensor([0.0])).item()
    assert value == pytest.approx(1.0 / (1.0 + 11.0 ** (-2.0 / 3.0)), rel=1e-6)
    assert value == pytest.approx(0.8318, abs=1e-4)


def test_deterministic_values():
    la = torch.tensor([-10.0, math.log(1.0 / 3.0), 0.0, math.log(99.0), 10.0])
    expected = torch.tensor([0.0, 0.25 * 1.2 - 0.1, 0.5, 1.0, 1.0])
    assert torch.allclose(deterministic_hard_concrete(la), expected, atol=1e-6)


def test_forward_switches_between_sample_and_deterministic():
    gates = HardConcrete(50)
    with torch.no_grad():
        gates.log_alpha.zero_()
    gates.eval()
    assert torch.equal(gates(), torch.full((50,), 0.5))
    gates.train()
    assert not torch.equal(gates(), torch.full((50,), 0.5))


def test_sample_is_reproducible_with_generator():
    gates = HardConcrete(64)
    with torch.no_grad():
        gates.log_alpha.zero_()
    a = gates.sample(torch.Generator().manual_seed(7))
    b = gates.sample(torch.Generator().manual_seed(7))
    c = gates.sample(torch.Generator().manual_seed(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_gradients_reach_log_alpha():
    gates = HardConcrete(32)
    with torch.no_grad():
        gates.log_alpha.zero_()
    gates.sample(torch.Generator().manual_seed(0)).sum().backward()
    grad = gates.log_alpha.grad
    assert grad is not None and torch.isfinite(grad).all()
    assert (grad > 0).sum() > 10  # fractional samples carry a positive gradient
    assert (grad >= 0).all()  # z is non-decreasing in log_alpha
    gates.log_alpha.grad = None
    gates.expected_l0().backward()
    assert (gates.log_alpha.grad > 0).all()


def test_reset_and_bad_arguments():
    gates = HardConcrete(4, droprate_init=0.5)
    assert torch.equal(gates.log_alpha.detach(), torch.zeros(4))
    with torch.no_grad():
        gates.log_alpha.fill_(-3.0)
    gates.reset_parameters()
    assert torch.equal(gates.log_alpha.detach(), torch.zeros(4))
    assert initial_log_alpha(0.01) == pytest.approx(math.log(99.0))
    with pytest.raises(ConfigError):
        HardConcrete(4, droprate_init=0.0)
    with pytest.raises(ConfigError):
        HardConcrete(4, beta=0.0)
    with pytest.raises(ConfigError):
        HardConcrete((0, 3))


# --- Lagrangian ----------------------------------------------------------------------------------


def test_expected_sparsity_unweighted_and_weighted():
    p = torch.tensor([1.0, 0.0, 0.5, 0.5])
    assert expected_sparsity(p).item() == pytest.approx(0.5)
    w = torch.tensor([3.0, 1.0, 0.0, 0.0])
    assert expected_sparsity(p, w).item() == pytest.approx(0.25)
    with pytest.raises(ConfigError):
        expected_sparsity(p, torch.ones(3))
    with pytest.raises(ConfigError):
        expected_sparsity(p, torch.zeros(4))


def test_component_weights():
    assert torch.equal(component_weights(2, 3), torch.ones(8))
    w = component_weights(2, 2, "params", d_model=4, d_head=2, d_mlp=8)
    assert w.tolist() == [32.0] * 4 + [64.0] * 2
    with pytest.raises(ConfigError):
        component_weights(2, 2, "params")
    with pytest.raises(ConfigError):
        component_weights(2, 2, "flops")


def test_penalty_value():
    controller = LagrangianController()
    assert controller.lambda_1.item() == 0.0 and controller.lambda_2.item() == 0.0
    assert controller.penalty(torch.tensor(0.3), 0.5).item() == 0.0
    with torch.no_grad():
        controller.lambda_1.fill_(2.0)
        controller.lambda_2.fill_(3.0)
    # 2 * (0.3 - 0.5) + 3 * (0.3 - 0.5)^2 = -0.4 + 0.12
    assert controller.penalty(torch.tensor(0.3), 0.5).item() == pytest.approx(-0.28)


def _one_step(t_value: float, s: float):
    controller = LagrangianController()
    log_alpha = torch.nn.Parameter(torch.tensor([0.0]))
    opt = pruning_optimizer([log_alpha], controller, lr_log_alpha=0.1, lr_lambda=1.0)
    # Make t a differentiable function of log_alpha with value t_value.
    t = torch.tensor(t_value) + 0.0 * log_alpha.sum()
    opt.zero_grad()
    controller.penalty(t, s).backward()
    opt.step()
    return controller


def test_ascent_drives_lambda1_down_when_below_target():
    # dL/dlambda1 = t - s < 0, so ascent lowers lambda1; lambda2 always rises.
    controller = _one_step(0.2, 0.5)
    assert controller.lambda_1.item() == pytest.approx(-1.0, abs=1e-3)
    assert controller.lambda_2.item() == pytest.approx(1.0, abs=1e-3)
    controller = _one_step(0.7, 0.5)
    assert controller.lambda_1.item() == pytest.approx(1.0, abs=1e-3)
    assert controller.lambda_2.item() == pytest.approx(1.0, abs=1e-3)


def test_negative_lambda1_makes_descent_raise_sparsity():
    gates = HardConcrete(10)
    controller = LagrangianController()
    with torch.no_grad():
        controller.lambda_1.fill_(-5.0)
    opt = pruning_optimizer(gates.parameters(), controller, lr_log_alpha=0.1, lr_lambda=1.0)
    before = expected_sparsity(gates.prob_nonzero()).item()
    for _ in range(5):
        opt.zero_grad()
        controller.penalty(expected_sparsity(gates.prob_nonzero()), 0.5).backward()
        opt.step()
    assert expected_sparsity(gates.prob_nonzero()).item() > before
    assert (gates.log_alpha < initial_log_alpha()).all()


def test_pruning_optimizer_rejects_bad_learning_rates():
    with pytest.raises(ConfigError):
        pruning_optimizer([torch.nn.Parameter(torch.zeros(1))], LagrangianController(), 0.0, 1.0)


# --- schedule ------------------------------------------------------------------------------------


def test_target_sparsity_schedule():
    assert target_sparsity_at(0, 0.5, 100) == 0.0
    assert target_sparsity_at(50, 0.5, 100) == pytest.approx(0.25)
    assert target_sparsity_at(100, 0.5, 100) == 0.5
    assert target_sparsity_at(1000, 0.5, 100) == 0.5
    assert target_sparsity_at(0, 0.5, 0) == 0.5
    with pytest.raises(ConfigError):
        target_sparsity_at(-1, 0.5, 100)


def test_paper_schedule():
    assert paper_schedule(0.5) == (9000, 9300)
    assert paper_schedule(0.7) == (10000, 10420)  # the paper's text says 10500 (see docstring)
    assert paper_schedule(0.05) == (6750, 6780)
    with pytest.raises(ConfigError):
        paper_schedule(1.0)


# --- discretisation ------------------------------------------------------------------------------


def test_binary_mask_removes_exactly_the_lowest():
    log_alpha = torch.randn(12, 13, generator=torch.Generator().manual_seed(0))
    for target in (0.1, 0.5, 0.7):
        mask, achieved = binary_mask_from_log_alpha(log_alpha, target)
        n_removed = round(target * log_alpha.numel())
        assert mask.shape == log_alpha.shape and mask.dtype == torch.bool
        assert int((~mask).sum()) == n_removed
        assert achieved.by_count == pytest.approx(n_removed / log_alpha.numel())
        assert achieved.by_weight is None
        assert log_alpha[~mask].max() < log_alpha[mask].min()


def test_binary_mask_edges_and_ties():
    mask, achieved = binary_mask_from_log_alpha(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0]), 0.4)
    assert mask.tolist() == [True, False, False, True, True]  # lower index removed first
    assert achieved.by_count == pytest.approx(0.4)
    assert binary_mask_from_log_alpha(torch.zeros(5), 0.0)[0].all()
    assert not binary_mask_from_log_alpha(torch.zeros(5), 1.0)[0].any()
    with pytest.raises(ConfigError):
        binary_mask_from_log_alpha(torch.zeros(5), 1.5)
    with pytest.raises(TrainingError):
        binary_mask_from_log_alpha(torch.tensor([0.0, float("nan")]), 0.5)


def test_binary_mask_weighted_sparsity():
    log_alpha = torch.tensor([0.0, 1.0, 2.0, 3.0])
    weights = torch.tensor([10.0, 1.0, 1.0, 8.0])
    mask, achieved = binary_mask_from_log_alpha(log_alpha, 0.5, weights)
    assert mask.tolist() == [False, False, True, True]
    assert achieved.by_count == pytest.approx(0.5)
    assert achieved.by_weight == pytest.approx(11.0 / 20.0)
    assert mask_sparsity(mask, weights) == achieved
    with pytest.raises(InterventionError):
        mask_sparsity(mask, torch.ones(3))


def test_flatten_unflatten_round_trip_and_order():
    heads = torch.arange(6.0).reshape(2, 3)
    mlps = torch.tensor([10.0, 11.0])
    flat = flatten_components(heads, mlps)
    assert flat.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 11.0]
    h, m = unflatten_components(flat, 2, 3)
    assert torch.equal(h, heads) and torch.equal(m, mlps)
    with pytest.raises(InterventionError):
        flatten_components(heads, torch.zeros(3))
    with pytest.raises(InterventionError):
        unflatten_components(flat, 3, 2)


def test_heads_and_mlps_ranked_together():
    heads = torch.tensor([[5.0, -1.0], [4.0, 3.0]])
    mlps = torch.tensor([-2.0, 6.0])
    mask, _ = binary_mask_from_log_alpha(flatten_components(heads, mlps), 2 / 6)
    head_mask, mlp_mask = unflatten_components(mask, 2, 2)
    assert head_mask.tolist() == [[True, False], [True, True]]
    assert mlp_mask.tolist() == [False, True]


# --- profiles and parsers ------------------------------------------------------------------------


def test_paper_profile():
    cfg = make_prune_config("paper", 0.5, 42)
    assert (cfg.warmup_steps, cfg.steps) == (9000, 9300)
    assert cfg.effective_batch_size == 128
    assert (cfg.lr_log_alpha, cfg.lr_lambda, cfg.max_length) == (0.1, 1.0, 128)
    assert (cfg.sparsity_weighting, cfg.fill) == ("components", "mean")
    assert make_prune_config("paper", 0.7, 1).warmup_steps == 10000


def test_quick_profile_and_steps_override_scales_warmup():
    cfg = make_prune_config("quick", 0.5, 0)
    assert cfg.grad_accumulation == 1 and cfg.batch_size == 16
    assert cfg.warmup_steps / cfg.steps == pytest.approx(9000 / 9300, abs=0.01)
    longer = make_prune_config("quick", 0.5, 0, steps=2 * cfg.steps)
    assert longer.warmup_steps == 2 * cfg.warmup_steps
    paper = make_prune_config("paper", 0.5, 0, steps=930)
    assert paper.warmup_steps == 900
    explicit = make_prune_config("quick", 0.5, 0, steps=100, warmup_steps=10, lr_lambda=0.5)
    assert (explicit.steps, explicit.warmup_steps, explicit.lr_lambda) == (100, 10, 0.5)


@pytest.mark.parametrize(
    ("target", "overrides"),
    [
        (0.0, {}),
        (1.0, {}),
        (0.5, {"steps": 0}),
        (0.5, {"steps": -5}),
        (0.5, {"steps": 10, "warmup_steps": 20}),
        (0.5, {"lr_log_alpha": 0.0}),
        (0.5, {"batch_size": 0}),
        (0.5, {"sparsity_weighting": "flops"}),
        (0.5, {"fill": "resample"}),
        (0.5, {"steps": 10.5}),
        (0.5, {"no_such_option": 1}),
    ],
)
def test_invalid_configs_raise(target, overrides):
    with pytest.raises(ConfigError):
        make_prune_config("quick", target, 0, **overrides)


def test_unknown_profile_raises():
    with pytest.raises(ConfigError):
        make_prune_config("fast", 0.5, 0)


def test_config_json_round_trip():
    cfg = make_prune_config("quick", 0.3, 7, sparsity_weighting="params", fill="zero")
    data = json.loads(json.dumps(cfg.to_dict()))
    assert PruneConfig.from_dict(data) == cfg
    data["lr_lambda"] = 1  # JSON ints for float fields are accepted
    assert PruneConfig.from_dict(data).lr_lambda == 1.0
    with pytest.raises(ConfigError):
        PruneConfig.from_dict({**data, "extra": 1})
    with pytest.raises(ConfigError):
        PruneConfig.from_dict({k: v for k, v in data.items() if k != "steps"})
    with pytest.raises(ConfigError):
        PruneConfig.from_dict({**data, "seed": "7"})


def test_parse_seed_spec_reads_seeds_as_the_command_line_does():
    assert parse_seed_spec("42-53") == list(range(42, 54))
    assert parse_seed_spec("1,2,5") == [1, 2, 5]
    assert parse_seed_spec("42-45, 50") == [42, 43, 44, 45, 50]
    # a bare count is seeds 0..N-1, as `--seeds 3` and `"seeds": 3` (the exported parser
    # had read "3" as seed 3)
    assert parse_seed_spec("3") == parse_seed_spec(3) == [0, 1, 2]
    assert parse_seed_spec("7-7") == [7] and parse_seed_spec([7]) == [7]
    for bad in ("", "a", "5-3", "1,,2", "1.5", "-3", "1,1", "40-45,44", "0", 0, True, []):
        with pytest.raises(ConfigError):
            parse_seed_spec(bad)


def test_parse_sparsities():
    assert parse_sparsities("0.5,0.7") == [0.5, 0.7]
    values = parse_sparsities("0.05:0.7:0.05")
    assert values == [round(0.05 * i, 2) for i in range(1, 15)]
    assert 0.3 in values and 0.7 in values
    assert parse_sparsities("0.1:0.3:0.1,0.5") == [0.1, 0.2, 0.3, 0.5]
    assert parse_sparsities("0.1:0.35:0.1") == [0.1, 0.2, 0.3]
    for bad in (
        "",
        "x",
        "0",
        "1.0",
        "0.5,1.2",
        "0.1:0.5",
        "0.1:0.5:0",
        "0.5:0.1:0.1",
        "0.5,0.5",
        "0:0.5:0.1",
        "nan",
    ):
        with pytest.raises(ConfigError):
            parse_sparsities(bad)


# --- end to end ----------------------------------------------------------------------------------


def test_toy_l0_optimisation_reaches_target_and_prunes_least_important():
    """Gates whose removal costs ``importance_i * (1 - z_i)`` plus the Lagrangian, with Adam.

    Half the components are nearly useless (importance 0.02-0.08), half matter (1-2). The run
    must track the ramped target, land within 0.05 of 0.5 expected sparsity, and the discrete
    mask must remove exactly the useless half.
    """
    n, target, steps, warmup = 24, 0.5, 400, 200
    data_gen = torch.Generator().manual_seed(100)
    k = round(target * n)
    importance = torch.cat(
        [
            0.02 + 0.06 * torch.rand(k, generator=data_gen),
            1.0 + torch.rand(n - k, generator=data_gen),
        ]
    )
    importance = importance[torch.randperm(n, generator=data_gen)]

    gates = HardConcrete(n)
    controller = LagrangianController()
    optimizer = pruning_optimizer(gates.parameters(), controller, lr_log_alpha=0.1, lr_lambda=1.0)
    noise = torch.Generator().manual_seed(0)
    for step in range(steps):
        z = gates.sample(noise)
        t = expected_sparsity(gates.prob_nonzero())
        s = target_sparsity_at(step, target, warmup)
        loss = (importance * (1 - z)).sum() + controller.penalty(t, s)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    final = expected_sparsity(gates.prob_nonzero()).item()
    assert final == pytest.approx(target, abs=0.05)
    mask, achieved = binary_mask_from_log_alpha(gates.log_alpha, target)
    assert achieved.by_count == pytest.approx(target)
    least_important = set(torch.argsort(importance)[:k].tolist())
    assert set(torch.nonzero(~mask).flatten().tolist()) == least_important
    gates.eval()
    assert torch.equal(gates() > 0, mask)
