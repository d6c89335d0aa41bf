"""Streaming activation statistics of every MLP neuron and every attention pre-out neuron.

A *neuron* is one unit of ``blocks.{l}.mlp.hook_post`` (``[n_layers, d_mlp]`` of them) or one
``(head, d_head)`` unit of ``blocks.{l}.attn.hook_z``, the attention "pre-out" activation
(``[n_layers, n_heads, d_head]``). Over a token stream we keep, per neuron: the token count, the
number of positive activations, the running mean and sum of squared deviations (merged batch by
batch with Chan et al.'s parallel Welford update, in float64), and the sums of ``|x|`` and
``sqrt|x|``. From these come the statistics the separability scores use (:data:`STATISTICS`):

- ``freq``: frequency of positive activation, ``P(x > 0)``;
- ``mean``: mean of ``x``;
- ``abs``: mean of ``|x|``;
- ``sqrt``: mean of ``sqrt|x|``;
- ``std``: the (population) standard deviation of ``x`` about its own mean -- a standard
  deviation, not a variance;
- ``rms``: root mean square, ``sqrt(mean(x^2)) = sqrt(var + mean^2)``.

Each batch is reduced with a handful of vectorised tensor operations (no loop over tokens) and
folded into accumulators whose size does not depend on the number of tokens. Padding is excluded
through a boolean token mask. Collection stops after the last block: the final norm and the
unembedding are never run (``stop_at_layer=n_layers``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from jaxtyping import Bool, Float, Int
from transformer_lens import HookedTransformer

from mi_core.buffers import Workspace
from mi_core.data.text import iter_batches
from mi_core.errors import ConfigError
from mi_core.models.hook_context import hooked
from mi_core.models.hooks import act_name

#: Statistic names, in the order scores and tables list them.
STATISTICS: tuple[str, ...] = ("freq", "mean", "abs", "sqrt", "std", "rms")

#: The two kinds of neurons the statistics cover, and their hook point (TransformerLens's
#: short name: ``post`` is ``blocks.{l}.mlp.hook_post``, ``z`` is ``blocks.{l}.attn.hook_z``).
SITES: dict[str, str] = {"mlp": "post", "attn": "z"}


@dataclass
class NeuronStats:
    """Running statistics of one kind of neuron, for every layer at once.

    ``count`` is per layer (every neuron of a layer sees the same tokens); the other tensors have
    the neuron shape ``[n_layers, *per_layer]``. All accumulators are float64.
    """

    count: Float[torch.Tensor, " n_layers"]
    positive: Float[torch.Tensor, "n_layers ..."]
    running_mean: Float[torch.Tensor, "n_layers ..."]
    m2: Float[torch.Tensor, "n_layers ..."]
    sum_abs: Float[torch.Tensor, "n_layers ..."]
    sum_sqrt: Float[torch.Tensor, "n_layers ..."]

    @classmethod
    def zeros(
        cls, n_layers: int, per_layer: tuple[int, ...], device: torch.device | str = "cpu"
    ) -> NeuronStats:
        """Empty statistics for ``n_layers`` layers of neurons shaped ``per_layer``."""
        shape = (n_layers, *per_layer)
        make = lambda s: torch.zeros(s, dtype=torch.float64, device=device)
        return cls(
            count=make((n_layers,)),
            positive=make(shape),
            running_mean=make(shape),
            m2=make(shape),
            sum_abs=make(shape),
            sum_sqrt=make(shape),
        )

    @property
    def shape(self) -> torch.Size:
        """The neuron shape ``[n_layers, *per_layer]``."""
        return self.running_mean.shape

    def _per_neuron(self, count: torch.Tensor) -> torch.Tensor:
        return count.reshape(-1, *([1] * (self.running_mean.ndim - 1)))

    def update(
        self,
        layer: int,
        x: Float[torch.Tensor, "tokens ..."],
        workspace: Workspace | None = None,
    ) -> None:
        """Fold a batch of activations ``x`` (one row per token) of one layer into the totals.

        ``workspace`` lends a reusable scratch buffer (fresh multi-megabyte buffers for every
        batch and layer cost more in page faults than the arithmetic).
        """
        n_b = x.shape[0]
        if n_b == 0:
            return
        if x.dtype not in (torch.float32, torch.float64):
            x = x.float()
        buf = (workspace or Workspace()).get(x)
        # Batch moments in the activation dtype (float32 is cheaper than float64 on a CPU:
        # benchmarks/README.md, Results, "batch moments"),
        # centred on the batch mean; the centred sum corrects mean and M2 for the rounding of
        # that mean exactly (sum (x-m)^2 = sum (x-mu)^2 + (sum (x-m))^2 / n).
        shift = x.mean(0)
        torch.sub(x, shift, out=buf)
        residual = buf.sum(0).double()
        m2_b = buf.square_().sum(0).double() - residual.square() / n_b
        mean_b = shift.double() + residual / n_b
        torch.sign(x, out=buf)
        positive_b = buf.clamp_(min=0).sum(0)  # much faster than (x > 0).sum(0)
        torch.abs(x, out=buf)
        sum_abs_b = buf.sum(0)
        sum_sqrt_b = buf.sqrt_().sum(0)

        n_a = self.count[layer]
        n = n_a + n_b
        delta = mean_b - self.running_mean[layer]
        self.running_mean[layer] += delta * (n_b / n)
        self.m2[layer] += m2_b + delta.square() * (n_a * n_b / n)
        self.count[layer] = n
        self.positive[layer] += positive_b
        self.sum_abs[layer] += sum_abs_b
        self.sum_sqrt[layer] += sum_sqrt_b

    def merge(self, other: NeuronStats) -> NeuronStats:
        """Statistics of the union of two disjoint token streams (Chan et al.'s parallel merge),
        on this one's device (statistics collected on a GPU merge with ones read from a file)."""
        if other.shape != self.shape:
            raise ConfigError(
                f"cannot merge statistics of shape {tuple(other.shape)} into {tuple(self.shape)}"
            )
        other = other.to(self.count.device)
        n_a, n_b = self._per_neuron(self.count), self._per_neuron(other.count)
        n = n_a + n_b
        safe_n = n.clamp(min=1)
        delta = other.running_mean - self.running_mean
        return NeuronStats(
            count=self.count + other.count,
            positive=self.positive + other.positive,
            running_mean=self.running_mean + delta * (n_b / safe_n),
            m2=self.m2 + other.m2 + delta.square() * (n_a * n_b / safe_n),
            sum_abs=self.sum_abs + other.sum_abs,
            sum_sqrt=self.sum_sqrt + other.sum_sqrt,
        )

    def _mean_of(self, total: torch.Tensor) -> torch.Tensor:
        return total / self._per_neuron(self.count).clamp(min=1)

    @property
    def freq(self) -> Float[torch.Tensor, "n_layers ..."]:
        """Frequency of positive activation."""
        return self._mean_of(self.positive)

    @property
    def mean(self) -> Float[torch.Tensor, "n_layers ..."]:
        """Mean activation."""
        return self.running_mean.clone()

    @property
    def mean_abs(self) -> Float[torch.Tensor, "n_layers ..."]:
        """Mean absolute activation."""
        return self._mean_of(self.sum_abs)

    @property
    def mean_sqrt(self) -> Float[torch.Tensor, "n_layers ..."]:
        """Mean square root of the absolute activation."""
        return self._mean_of(self.sum_sqrt)

    @property
    def var(self) -> Float[torch.Tensor, "n_layers ..."]:
        """Population variance (divides by the token count)."""
        return self._mean_of(self.m2)

    @property
    def std(self) -> Float[torch.Tensor, "n_layers ..."]:
        """Population standard deviation about the neuron's own mean."""
        return self.var.sqrt()

    @property
    def rms(self) -> Float[torch.Tensor, "n_layers ..."]:
        """Root mean square activation."""
        return (self.var + self.running_mean.square()).sqrt()

    def statistic(self, name: str) -> Float[torch.Tensor, "n_layers ..."]:
        """One of :data:`STATISTICS` by name."""
        getters: dict[str, Callable[[], torch.Tensor]] = {
            "freq": lambda: self.freq,
            "mean": lambda: self.mean,
            "abs": lambda: self.mean_abs,
            "sqrt": lambda: self.mean_sqrt,
            "std": lambda: self.std,
            "rms": lambda: self.rms,
        }
        if name not in getters:
            raise ConfigError(f"unknown statistic {name!r}; expected one of {list(STATISTICS)}")
        return getters[name]()

    def to(self, device: torch.device | str) -> NeuronStats:
        """A copy on ``device``."""
        return NeuronStats(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def state_dict(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """The accumulators as a flat tensor dict (for safetensors)."""
        return {prefix + f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_state_dict(cls, tensors: dict[str, torch.Tensor], prefix: str = "") -> NeuronStats:
        """Inverse of :meth:`state_dict`."""
        return cls(**{f.name: tensors[prefix + f.name].to(torch.float64) for f in fields(cls)})


@dataclass
class ActivationStats:
    """Statistics of the MLP neurons and the attention pre-out neurons of one model on one stream.

    Either part is ``None`` when it was not collected.
    """

    mlp: NeuronStats | None
    attn: NeuronStats | None

    @property
    def n_tokens(self) -> int:
        """Number of (unpadded) tokens seen."""
        part = self.mlp if self.mlp is not None else self.attn
        return 0 if part is None else int(part.count[0])

    def merge(self, other: ActivationStats) -> ActivationStats:
        """Statistics of the union of two disjoint token streams."""
        merged = {}
        for site in SITES:
            mine, theirs = getattr(self, site), getattr(other, site)
            if (mine is None) != (theirs is None):
                raise ConfigError(f"cannot merge statistics with and without {site!r} neurons")
            merged[site] = None if mine is None else mine.merge(theirs)
        return ActivationStats(**merged)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """All accumulators as one flat tensor dict (keys ``mlp.*`` and ``attn.*``)."""
        out: dict[str, torch.Tensor] = {}
        for site in SITES:
            part = getattr(self, site)
            if part is not None:
                out.update(part.state_dict(prefix=f"{site}."))
        return out

    @classmethod
    def from_state_dict(cls, tensors: dict[str, torch.Tensor]) -> ActivationStats:
        """Inverse of :meth:`state_dict`."""
        parts = {
            site: NeuronStats.from_state_dict(tensors, prefix=f"{site}.")
            if f"{site}.count" in tensors
            else None
            for site in SITES
        }
        return cls(**parts)


def _stats_hook(
    stats: NeuronStats, layer: int, flat_mask: list[torch.Tensor | None], workspace: Workspace
) -> Callable[[torch.Tensor, object], None]:
    def hook(activation: torch.Tensor, hook: object) -> None:
        rows = activation.detach().reshape(-1, *activation.shape[2:])
        mask = flat_mask[0]
        stats.update(layer, rows if mask is None else rows[mask], workspace)

    return hook


def correct_positions(
    logits: Float[torch.Tensor, "batch pos vocab"],
    tokens: Int[torch.Tensor, "batch pos"],
    top_k: int,
    token_mask: Bool[torch.Tensor, "batch pos"] | None = None,
) -> Bool[torch.Tensor, "batch pos"]:
    """Positions whose next token is among the model's ``top_k`` predictions there.

    The last position of a row (and a position whose next token is padding) has no next token
    and is never correct. Ranks count the tokens scored strictly higher than the target.
    """
    target = tokens[:, 1:]
    scores = logits[:, :-1]
    target_score = scores.gather(-1, target[..., None])
    rank = (scores > target_score).sum(dim=-1)
    correct = torch.zeros(tokens.shape, dtype=torch.bool, device=tokens.device)
    correct[:, :-1] = rank < top_k
    if token_mask is not None:
        correct[:, :-1] &= token_mask[:, :-1].bool() & token_mask[:, 1:].bool()
    return correct


@torch.no_grad()
def collect_activation_stats(
    model: HookedTransformer,
    tokens: Int[torch.Tensor, "n pos"],
    token_mask: Bool[torch.Tensor, "n pos"] | None = None,
    *,
    batch_size: int = 8,
    sites: tuple[str, ...] = ("mlp", "attn"),
    fwd_hooks: list[tuple[str, Callable]] | None = None,
    progress: bool = False,
    desc: str = "statistics",
    correct_top_k: int = 0,
) -> ActivationStats:
    """Collect :class:`ActivationStats` of ``model`` over token windows.

    :param model: the model; it runs up to the last block only (no final norm, no unembedding).
    :param tokens: token windows ``[n, pos]``.
    :param token_mask: ``True`` for real tokens, ``False`` for padding (excluded from every
        statistic, and passed to the model as its attention mask). ``None``: no padding.
    :param batch_size: windows per forward pass.
    :param sites: which neurons to collect, a subset of ``("mlp", "attn")``.
    :param fwd_hooks: hooks that run before the statistics hooks on the same hook points, e.g.
        the pruning masks of :meth:`mi_core.interventions.neurons.PruneMasks.hooks`, so that the
        statistics describe the pruned model.
    :param progress: show a tqdm bar over batches.
    :param correct_top_k: when positive, count only the positions whose next token is among the
        model's top-k predictions there (:func:`correct_positions`; an option of the
        reference code, which used k = 10). Each batch then runs twice: once to the logits
        (with ``fwd_hooks``), once for the statistics.
    """
    if correct_top_k < 0:
        raise ConfigError(f"correct_top_k must be >= 0, got {correct_top_k}")
    unknown = set(sites) - set(SITES)
    if unknown or not sites:
        raise ConfigError(f"sites must be a non-empty subset of {list(SITES)}, got {list(sites)}")
    cfg = model.cfg
    if "mlp" in sites and cfg.num_experts:
        raise ConfigError(
            "MLP neuron statistics are not defined for a mixture-of-experts MLP (Mixtral, "
            "OLMoE, GPT-OSS): each expert has its own neurons and sees only the tokens routed "
            "to it; score attention neurons only (sites=('attn',); in mi-core separability, "
            "--ff-frac 0 --attn-frac F)"
        )
    device = cfg.device
    per_layer = {"mlp": (cfg.d_mlp,), "attn": (cfg.n_heads, cfg.d_head)}
    collected = {
        site: NeuronStats.zeros(cfg.n_layers, per_layer[site], device=device)
        if site in sites
        else None
        for site in SITES
    }
    current_mask: list[torch.Tensor | None] = [None]
    workspaces = {site: Workspace() for site in sites}
    stat_hooks = [
        (
            act_name(SITES[site], layer),
            _stats_hook(collected[site], layer, current_mask, workspaces[site]),
        )
        for site in sites
        for layer in range(cfg.n_layers)
    ]
    hooks = list(fwd_hooks or []) + stat_hooks
    batches = iter_batches(tokens, token_mask, batch_size)
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, total=-(-tokens.shape[0] // batch_size), desc=desc, leave=False)
    for batch, mask in batches:
        batch = batch.to(device)
        attention_mask = None
        if mask is not None:
            mask = mask.to(device=device, dtype=torch.bool)
            attention_mask = mask.to(torch.long)
            current_mask[0] = mask.reshape(-1)
        else:
            current_mask[0] = None
        if correct_top_k:
            with hooked(model, list(fwd_hooks or [])):
                logits = model(batch, attention_mask=attention_mask)
            current_mask[0] = correct_positions(logits, batch, correct_top_k, mask).reshape(-1)
        with hooked(model, hooks):
            model(batch, attention_mask=attention_mask, stop_at_layer=cfg.n_layers)
    return ActivationStats(**collected)
