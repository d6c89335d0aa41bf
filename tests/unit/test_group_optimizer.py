"""A batched group's optimizer steps taken together (GroupAdamW) equal each run's own
clip_grad_norm_ and AdamW (the gates descending, the lambdas ascending, decoupled weight decay),
with each run's learning rate, step count and clipping; its state goes back to each run's AdamW."""

from __future__ import annotations

import math

import pytest
import torch

from mi_core.errors import ConfigError
from mi_core.pruning.group_optimizer import GroupAdamW
from mi_core.pruning.hard_concrete import HardConcrete
from mi_core.pruning.lagrangian import LagrangianController, pruning_optimizer


def _run(seed: int, n: int = 7):
    gen = torch.Generator().manual_seed(seed)
    gates = HardConcrete(n, init_mean=2.0, init_std=0.5, generator=gen)
    controller = LagrangianController()
    with torch.no_grad():
        controller.lambda_1.fill_(0.3 * seed)
        controller.lambda_2.fill_(-0.1 * seed)
    optimizer = pruning_optimizer(gates.parameters(), controller, 0.1, 0.05, 0.01, 0.02)
    return [gates.log_alpha, controller.lambda_1, controller.lambda_2], optimizer


def _grads(step: int, k: int, params) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + k)
    scale = 30.0 if (step + k) % 3 == 0 else 0.2  # some steps clipped, some not
    return [torch.randn(p.shape, generator=gen) * scale for p in params]


@pytest.mark.parametrize(
    "fused, max_norms",
    [(False, [1.0, 1.0, 2.5]), (True, [1.0, 1.0, 2.5]), (False, [math.inf] * 3)],
    ids=["clipped", "fused", "no-clipping"],
)
def test_group_adamw_equals_each_runs_own_clipping_and_adamw(fused, max_norms):
    """``fused``: AdamW as pruning_optimizer builds it on a GPU (its step count is a tensor on
    the parameters' device; the CPU has the fused kernel too). ``inf``: max_grad_norm 0."""
    runs = 3
    alone = [_run(k) for k in range(runs)]
    together = [_run(k) for k in range(runs)]
    for _, optimizer in alone + together:
        for group_ in optimizer.param_groups:
            group_["fused"] = fused
    # run 2 resumes: its AdamW already took two steps, alone and in the group alike
    for params, optimizer in (alone[2], together[2]):
        for step in (-2, -1):
            for p, g in zip(params, _grads(step, 2, params), strict=True):
                p.grad = g
            optimizer.step()
    group = GroupAdamW([o for _, o in together], [p for p, _ in together], max_norms)
    for step in range(6):
        rows = [0, 2] if step == 3 else [0, 1, 2]  # run 1 sits a step out
        factors = [0.5 + 0.1 * step, 1.0, 0.2 * (step + 1)]  # each run's own schedule
        norms_alone = []
        for k in rows:
            for (params, optimizer), max_norm in ((alone[k], max_norms[k]),
                                                  (together[k], None)):  # fmt: skip
                for p, g in zip(params, _grads(step, k, params), strict=True):
                    p.grad = g.clone()
                for group_, base in zip(optimizer.param_groups, (0.1, 0.05), strict=True):
                    group_["lr"] = base * factors[k]
                if max_norm is not None:
                    norms_alone.append(float(torch.nn.utils.clip_grad_norm_(params, max_norm)))
                    optimizer.step()
        norms = group.step(rows).tolist()
        assert norms == pytest.approx(norms_alone, rel=1e-6)
        for k in range(runs):
            for a, b in zip(alone[k][0], together[k][0], strict=True):
                torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
    # the clipping acted on some steps (else the test would not test it)
    assert max(norms_alone) > 2.5 or math.isinf(max_norms[0])
    for k in range(runs):
        group.export(k)
        want, got = alone[k][1].state_dict()["state"], together[k][1].state_dict()["state"]
        assert want.keys() == got.keys()
        for i in want:
            assert float(got[i]["step"]) == float(want[i]["step"])
            for key in ("exp_avg", "exp_avg_sq"):  # float rounding of tiny squares: 1e-4
                torch.testing.assert_close(got[i][key], want[i][key], rtol=1e-4, atol=1e-10)


def test_group_adamw_takes_only_pruning_optimizers():
    params, _ = _run(0)
    other = torch.optim.AdamW(params)
    with pytest.raises(ConfigError, match="pruning_optimizer"):
        GroupAdamW([other], [params], [1.0])
