"""The optimizer steps of a batched group's runs, taken together.

Each run of a group keeps its own AdamW (:func:`~mi_core.pruning.lagrangian.pruning_optimizer`:
the gates descending, the lambdas ascending, decoupled weight decay) and its own gradient-norm
clipping. Stepped one run after another, that is a clipping and an optimizer step per run, each
a handful of kernels and Python calls: on a GPU, where the shared forward / backward pass is
cheap, each is host time the device waits on (what taking them together saves on a CPU:
benchmarks/README.md, Results, the A / B probe of ``GroupAdamW``). :class:`GroupAdamW` holds
the runs' moments stacked ``[runs, ...]`` and takes every run's clipping and AdamW update as a
few kernels for the whole group, with each run's own learning rate (its schedule's factor),
step count and weight decay. It computes what ``torch.nn.utils.clip_grad_norm_`` and
``torch.optim.AdamW`` compute for each run alone (tested: equal to float rounding); each run's
``AdamW`` object gets its state back (:meth:`GroupAdamW.export`) before its checkpoint is
written, so checkpoints and resumption are those of a run alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float

from mi_core.devices import move
from mi_core.errors import ConfigError

#: ``clip_grad_norm_``'s guard against a zero norm
_CLIP_EPS = 1e-6


class GroupAdamW:
    """AdamW and gradient-norm clipping for ``K`` runs' gates and lambdas at once.

    ``optimizers[k]`` is run ``k``'s AdamW over ``params[k] = [log_alpha, lambda_1, lambda_2]``
    in two groups (gates; lambdas with ``maximize``); their state, if resumed, is read once
    here. ``max_norm[k]`` is run ``k``'s clipping threshold (``inf``: none).
    """

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        params: Sequence[Sequence[torch.Tensor]],
        max_norm: Sequence[float],
    ) -> None:
        self.optimizers = list(optimizers)
        self.params = [list(p) for p in params]
        first = self.optimizers[0].param_groups
        for opt, p in zip(self.optimizers, self.params, strict=True):
            groups = opt.param_groups
            if (
                len(groups) != 2
                or [len(g["params"]) for g in groups] != [1, 2]
                or groups[0]["params"][0] is not p[0]
                or [g["maximize"] for g in groups] != [False, True]
                or any(g.get("amsgrad") for g in groups)
                or any(  # a resumed group's betas are a list (read back from JSON)
                    tuple(g["betas"]) != tuple(first[0]["betas"]) or g["eps"] != first[0]["eps"]
                    for g in groups
                )
            ):
                raise ConfigError("GroupAdamW takes the optimizers pruning_optimizer builds")
        self.beta1, self.beta2 = (float(b) for b in first[0]["betas"])
        self.eps = first[0]["eps"]
        log_alpha = self.params[0][0]
        device, n = log_alpha.device, log_alpha.numel()
        k = len(self.params)
        zeros = dict(device=device, dtype=log_alpha.dtype)
        self.m_gates, self.v_gates = torch.zeros(k, n, **zeros), torch.zeros(k, n, **zeros)
        self.m_lambdas, self.v_lambdas = torch.zeros(k, 2, **zeros), torch.zeros(k, 2, **zeros)
        self.steps = torch.zeros(k, **zeros)
        for row, (opt, p) in enumerate(zip(self.optimizers, self.params, strict=True)):
            state = [opt.state.get(t, {}) for t in p]
            if not state[0]:
                continue  # a fresh run
            self.m_gates[row] = state[0]["exp_avg"].reshape(-1)
            self.v_gates[row] = state[0]["exp_avg_sq"].reshape(-1)
            for j in (0, 1):
                self.m_lambdas[row, j] = state[1 + j]["exp_avg"]
                self.v_lambdas[row, j] = state[1 + j]["exp_avg_sq"]
            self.steps[row] = float(state[0]["step"])
        self.decay = torch.tensor(
            [[g["weight_decay"] for g in opt.param_groups] for opt in self.optimizers], **zeros
        )
        self.max_norm = torch.tensor([float(x) for x in max_norm], **zeros)

    def step(self, rows: Sequence[int]) -> Float[torch.Tensor, " rows"]:
        """Clip and step the runs at ``rows`` (their gradients are in the parameters' ``grad``;
        their learning rates are read from their optimizers' param groups, where the schedule
        sets them). Returns each run's gradient norm before clipping, on the device."""
        rows = list(rows)
        every = rows == list(range(len(self.params)))
        index = None if every else torch.tensor(rows, device=self.steps.device)

        def take(t: torch.Tensor) -> torch.Tensor:
            return t if index is None else t.index_select(0, index)

        def put(t: torch.Tensor, value: torch.Tensor) -> None:
            if index is None:
                t.copy_(value)
            else:
                t.index_copy_(0, index, value)

        params = [self.params[r] for r in rows]
        with torch.no_grad():
            gates = torch.stack([p[0].detach() for p in params]).reshape(len(rows), -1)
            lambdas = torch.stack([t.detach().reshape(()) for p in params for t in p[1:]])
            lambdas = lambdas.view(len(rows), 2)
            g_gates = torch.stack([_grad(p[0]) for p in params]).reshape(len(rows), -1)
            g_lambdas = torch.stack([_grad(t).reshape(()) for p in params for t in p[1:]])
            g_lambdas = g_lambdas.view(len(rows), 2)
            # clip_grad_norm_: the total norm over the run's tensors, the coefficient clamped at 1
            norms = (g_gates.square().sum(1) + g_lambdas.square().sum(1)).sqrt()
            coef = (take(self.max_norm) / (norms + _CLIP_EPS)).clamp(max=1.0)[:, None]
            g_gates, g_lambdas = g_gates * coef, -(g_lambdas * coef)  # the lambdas ascend
            lr = move(  # through pinned memory: the host does not wait for the device
                torch.tensor(
                    [[g["lr"] for g in self.optimizers[r].param_groups] for r in rows],
                    dtype=gates.dtype,
                ),
                gates.device,
            )
            steps = take(self.steps) + 1
            put(self.steps, steps)
            decay = take(self.decay)
            # in float64, as AdamW takes them (1 - 0.999 in float32 is 1.3e-5 off)
            correction1 = (1 - self.beta1 ** steps.double()).to(steps.dtype)
            correction2 = (1 - self.beta2 ** steps.double()).sqrt().to(steps.dtype)
            new = []
            for j, (p, g, m_all, v_all) in enumerate(
                (
                    (gates, g_gates, self.m_gates, self.v_gates),
                    (lambdas, g_lambdas, self.m_lambdas, self.v_lambdas),
                )  # fmt: skip
            ):
                m, v = take(m_all), take(v_all)
                m = m.lerp(g, 1 - self.beta1)
                v = v * self.beta2 + (1 - self.beta2) * g * g
                put(m_all, m)
                put(v_all, v)
                rate = lr[:, j : j + 1]
                p = p * (1 - rate * decay[:, j : j + 1])  # decoupled weight decay
                denom = v.sqrt() / correction2[:, None] + self.eps
                new.append(p - (rate / correction1[:, None]) * m / denom)
            torch._foreach_copy_(
                [p[0] for p in params],
                [row.view_as(p[0]) for p, row in zip(params, new[0], strict=True)],
            )
            torch._foreach_copy_(
                [t for p in params for t in p[1:]],
                [x.view(()) for x in new[1].reshape(-1).unbind(0)],
            )
        return norms

    def export(self, row: int) -> None:
        """Write run ``row``'s moments and step count into its own AdamW (as a run alone would
        hold them), e.g. before its checkpoint is written."""
        opt, params = self.optimizers[row], self.params[row]
        on_device = any(g.get("fused") or g.get("capturable") for g in opt.param_groups)
        step = self.steps[row].detach().clone()
        step = step if on_device else step.cpu()
        opt.state[params[0]] = {
            "step": step,
            "exp_avg": self.m_gates[row].view_as(params[0]).clone(),
            "exp_avg_sq": self.v_gates[row].view_as(params[0]).clone(),
        }
        for j, t in enumerate(params[1:]):
            opt.state[t] = {
                "step": step.clone(),
                "exp_avg": self.m_lambdas[row, j].clone().view_as(t),
                "exp_avg_sq": self.v_lambdas[row, j].clone().view_as(t),
            }


def _grad(t: torch.Tensor) -> torch.Tensor:
    # every run's loss reaches its gates and lambdas, so a gradient is always there; AdamW
    # would skip a parameter without one, which a stacked step cannot (zeros: close, not equal)
    return t.grad if t.grad is not None else torch.zeros_like(t)
