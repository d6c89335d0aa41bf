"""Next-token metrics on held-out token windows: loss, top-1 and top-10 accuracy, and "skip50".

"skip50" metrics leave out the predictions whose target is one of the 50 most frequent tokens
of the data set (counted on its *statistics* part with :func:`most_frequent_tokens`, never on the
held-out tokens that are scored): the easy part of next-token prediction.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Bool, Int
from transformer_lens import HookedTransformer

from mi_core.data.text import iter_batches
from mi_core.models.hook_context import hooked

#: Metric names, in the order tables list them. Accuracies are fractions in [0, 1].
METRICS: tuple[str, ...] = (
    "loss",
    "top1",
    "top10",
    "skip50_loss",
    "skip50_top1",
    "skip50_top10",
)


def most_frequent_tokens(
    tokens: Int[torch.Tensor, "n pos"],
    token_mask: Bool[torch.Tensor, "n pos"] | None = None,
    k: int = 50,
) -> Int[torch.Tensor, " k"]:
    """The ``k`` most frequent token ids among the (unpadded) tokens, most frequent first."""
    flat = tokens.flatten() if token_mask is None else tokens[token_mask.bool()]
    counts = torch.bincount(flat.cpu().long())
    k = min(k, int((counts > 0).sum()))
    order = torch.sort(counts, descending=True, stable=True).indices
    return order[:k]


@torch.no_grad()
def evaluate_next_token(
    model: HookedTransformer,
    tokens: Int[torch.Tensor, "n pos"],
    token_mask: Bool[torch.Tensor, "n pos"] | None = None,
    *,
    skip_tokens: Int[torch.Tensor, " k"] | None = None,
    fwd_hooks: list[tuple[str, Callable]] | None = None,
    batch_size: int = 8,
    progress: bool = False,
    desc: str = "evaluate",
) -> dict[str, float]:
    """Mean loss and top-1 / top-10 accuracy of next-token prediction over ``tokens``.

    A prediction counts when both its input and its target position are real tokens. The
    ``skip50_*`` entries score only targets not in ``skip_tokens`` (``nan`` without
    ``skip_tokens``). Also returns ``n_tokens`` and ``n_skip_tokens``, the predictions counted,
    and ``text_loss``: the mean over rows of each row's mean loss (the report's loss, each text
    weighing the same, when every row is one text). ``fwd_hooks`` (e.g. pruning masks) are
    active during the forward passes.
    """
    device = model.cfg.device
    skip = None if skip_tokens is None else skip_tokens.to(device)
    totals = torch.zeros(8, dtype=torch.float64, device=device)
    text_loss_sum, n_texts = 0.0, 0
    batches = iter_batches(tokens, token_mask, batch_size)
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, total=-(-tokens.shape[0] // batch_size), desc=desc, leave=False)
    for batch, mask in batches:
        batch = batch.to(device)
        attention_mask = None if mask is None else mask.to(device=device, dtype=torch.long)
        with hooked(model, list(fwd_hooks or [])):
            logits = model(batch, attention_mask=attention_mask)
        logits = logits[:, :-1].float()
        targets = batch[:, 1:]
        valid = torch.ones_like(targets, dtype=torch.bool)
        if mask is not None:
            mask = mask.to(device=device, dtype=torch.bool)
            valid = mask[:, :-1] & mask[:, 1:]
        row_of = torch.arange(valid.shape[0], device=device)[:, None].expand_as(valid)[valid]
        logits, targets = logits[valid], targets[valid]
        log_norm = torch.logsumexp(logits, dim=-1)
        target_logit = logits.gather(-1, targets[:, None]).squeeze(-1)
        loss = log_norm - target_logit
        per_row = torch.zeros(valid.shape[0], dtype=torch.float64, device=device)
        per_row.index_add_(0, row_of, loss.double())
        counts = valid.sum(dim=1)
        has = counts > 0
        text_loss_sum += float((per_row[has] / counts[has]).sum())
        n_texts += int(has.sum())
        # rank = number of tokens scored strictly higher than the target
        rank = (logits > target_logit[:, None]).sum(dim=-1)
        kept = (
            torch.ones_like(targets, dtype=torch.bool)
            if skip is None
            else ~torch.isin(targets, skip)
        )
        kept_f = kept.double()
        totals += torch.stack(
            [
                torch.tensor(float(targets.numel()), dtype=torch.float64, device=device),
                loss.double().sum(),
                (rank < 1).double().sum(),
                (rank < 10).double().sum(),
                kept_f.sum(),
                (loss.double() * kept_f).sum(),
                ((rank < 1).double() * kept_f).sum(),
                ((rank < 10).double() * kept_f).sum(),
            ]
        )
    n, loss, top1, top10, n_skip, skip_loss, skip_top1, skip_top10 = totals.tolist()
    div = lambda a, b: a / b if b > 0 else float("nan")
    has_skip = skip is not None
    return {
        "loss": div(loss, n),
        "top1": div(top1, n),
        "top10": div(top10, n),
        "skip50_loss": div(skip_loss, n_skip) if has_skip else float("nan"),
        "skip50_top1": div(skip_top1, n_skip) if has_skip else float("nan"),
        "skip50_top10": div(skip_top10, n_skip) if has_skip else float("nan"),
        "n_tokens": int(n),
        "n_skip_tokens": int(n_skip) if has_skip else 0,
        "text_loss": div(text_loss_sum, n_texts),
    }
