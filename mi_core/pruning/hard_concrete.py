"""Hard-concrete masks: the stochastic, differentiable gates that L0 pruning learns.

One gate per component (attention head or MLP layer). Each gate ``z`` is a hard-concrete random
variable (Louizos et al., 2018, "Learning Sparse Neural Networks through L0 Regularization"),
parameterised exactly as in CoFi (Xia et al., 2022) and in the paper's appendix B::

    u ~ Uniform(eps, 1 - eps)
    s = sigmoid((log u - log(1 - u) + log_alpha) / beta)
    s_bar = s * (r - l) + l
    z = min(1, max(0, s_bar))

with ``beta = 2/3``, ``[l, r] = [-0.1, 1.1]`` and ``eps = 1e-6``. The paper prints the second line
as ``sigmoid(1/beta * u / (1 - u) + log_alpha)``; that is a typo (it is neither the logistic
noise ``log u - log(1 - u)`` nor divides ``log_alpha`` by the temperature), so the standard
Louizos/CoFi form above is used. It also calls ``1/beta = 2/3`` the temperature; the standard
(and CoFi's) value is ``beta = 2/3``.

The stretch to ``[l, r]`` followed by the clamp puts finite probability mass on exactly 0 and
exactly 1, so samples are genuinely sparse while ``log_alpha`` still receives gradients through
the fractional samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from jaxtyping import Float
from torch import nn

from mi_core.devices import move
from mi_core.errors import ConfigError
from mi_core.pruning.constants import (  # noqa: F401 (re-exported)
    BETA,
    DROPRATE_INIT,
    LIMIT_LEFT,
    LIMIT_RIGHT,
    PAPER_INIT_MEAN,
    PAPER_INIT_STD,
    initial_log_alpha,
)

EPS = 1e-6


def sample_hard_concrete(
    log_alpha: Float[torch.Tensor, "*components"],
    beta: float = BETA,
    generator: torch.Generator | None = None,
) -> Float[torch.Tensor, "*components"]:
    """Draw one hard-concrete gate per entry of ``log_alpha``, differentiable wrt ``log_alpha``.

    ``generator`` makes the draw reproducible. The uniform noise is drawn on the generator's
    device and moved to ``log_alpha``'s, so a CPU generator gives the same gates on the CPU and
    on a GPU (a seed means one subnetwork whatever the device; the jobs all pass one).
    """
    noise_device = generator.device if generator is not None else log_alpha.device
    u = torch.rand(log_alpha.shape, generator=generator, device=noise_device, dtype=log_alpha.dtype)
    return hard_concrete_from_uniform(log_alpha, move(u, log_alpha.device), beta)


def hard_concrete_from_uniform(
    log_alpha: Float[torch.Tensor, "*components"],
    u: Float[torch.Tensor, "*components"],
    beta: float = BETA,
) -> Float[torch.Tensor, "*components"]:
    """The hard-concrete gates for given uniform noise ``u`` in [0, 1): the stretched, clamped
    ``sigmoid((log u - log(1 - u) + log_alpha) / beta)``. :func:`sample_hard_concrete` draws
    ``u``; a batched group stacks its runs' draws and transforms them in one pass."""
    u = u * (1.0 - 2.0 * EPS) + EPS
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / beta)
    return torch.clamp(s * (LIMIT_RIGHT - LIMIT_LEFT) + LIMIT_LEFT, 0.0, 1.0)


def deterministic_hard_concrete(
    log_alpha: Float[torch.Tensor, "*components"],
) -> Float[torch.Tensor, "*components"]:
    """The eval-time gate value: ``clamp(sigmoid(log_alpha) * (r - l) + l, 0, 1)`` (Louizos)."""
    return torch.clamp(torch.sigmoid(log_alpha) * (LIMIT_RIGHT - LIMIT_LEFT) + LIMIT_LEFT, 0.0, 1.0)


def hard_concrete_prob_nonzero(
    log_alpha: Float[torch.Tensor, "*components"], beta: float = BETA
) -> Float[torch.Tensor, "*components"]:
    """``P(z != 0) = sigmoid(log_alpha - beta * log(-l / r))`` per gate: the expected L0 norm."""
    return torch.sigmoid(log_alpha - beta * math.log(-LIMIT_LEFT / LIMIT_RIGHT))


class HardConcrete(nn.Module):
    """A tensor of hard-concrete gates with learnt ``log_alpha``; every gate starts on.

    ``log_alpha`` starts at ``init_mean`` (default: CoFi's ``log(1 - d) - log(d)`` from
    ``droprate_init``) plus Gaussian noise of std ``init_std`` drawn from ``generator`` (the
    authors draw N(10, 0.01): :data:`PAPER_INIT_MEAN`, :data:`PAPER_INIT_STD`).
    ``forward()`` samples in training mode and returns the deterministic eval value otherwise,
    so ``module.train()`` / ``module.eval()`` switch the behaviour like dropout. The eval value
    is Louizos' deterministic gate unless ``eval_gate`` maps ``log_alpha`` to another (the gates
    of a pruning run, :func:`~mi_core.pruning.discretize.make_gates`, give its subnetwork).
    """

    def __init__(
        self,
        shape: int | tuple[int, ...],
        beta: float = BETA,
        droprate_init: float = DROPRATE_INIT,
        *,
        init_mean: float | None = None,
        init_std: float = 0.0,
        generator: torch.Generator | None = None,
        eval_gate: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.eval_gate = eval_gate
        if beta <= 0:
            raise ConfigError(f"hard-concrete beta (temperature) must be positive, got {beta}")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if any(size <= 0 for size in shape):
            raise ConfigError(f"hard-concrete shape must have positive sizes, got {shape}")
        if init_std < 0 or not math.isfinite(init_std):
            raise ConfigError(f"init_std must be a non-negative number, got {init_std}")
        self.beta = beta
        self.init_mean = initial_log_alpha(droprate_init) if init_mean is None else init_mean
        if not math.isfinite(self.init_mean):
            raise ConfigError(f"init_mean must be finite, got {self.init_mean}")
        self.init_std = init_std
        self.log_alpha = nn.Parameter(torch.empty(shape))
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Draw every ``log_alpha`` again from N(init_mean, init_std) (every gate on).

        The draw happens on the CPU (``generator`` must be a CPU generator), so a seed gives the
        same gates on every device.
        """
        values = torch.full(self.log_alpha.shape, self.init_mean, dtype=torch.float32)
        if self.init_std > 0:
            values += self.init_std * torch.randn(values.shape, generator=generator)
        self.log_alpha.copy_(values)

    def sample(self, generator: torch.Generator | None = None) -> Float[torch.Tensor, "*shape"]:
        """One stochastic draw of every gate, in ``[0, 1]``, differentiable wrt ``log_alpha``."""
        return sample_hard_concrete(self.log_alpha, self.beta, generator)

    def deterministic(self) -> Float[torch.Tensor, "*shape"]:
        """The eval-time value of every gate: ``eval_gate(log_alpha)`` where one was given,
        else Louizos' deterministic gate."""
        if self.eval_gate is not None:
            return self.eval_gate(self.log_alpha)
        return deterministic_hard_concrete(self.log_alpha)

    def prob_nonzero(self) -> Float[torch.Tensor, "*shape"]:
        """``P(z != 0)`` per gate (differentiable; feeds the expected sparsity)."""
        return hard_concrete_prob_nonzero(self.log_alpha, self.beta)

    def expected_l0(self) -> Float[torch.Tensor, ""]:
        """The expected number of non-zero gates: the sum of :meth:`prob_nonzero`."""
        return self.prob_nonzero().sum()

    def forward(self, generator: torch.Generator | None = None) -> Float[torch.Tensor, "*shape"]:
        """A sample in training mode, the deterministic value in eval mode."""
        return self.sample(generator) if self.training else self.deterministic()

    def extra_repr(self) -> str:
        return f"shape={tuple(self.log_alpha.shape)}, beta={self.beta:.4g}"
