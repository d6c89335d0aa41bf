"""Evaluation: a classifier's accuracy on pair data sets, a language model's next-token metrics.

- :mod:`~mi_core.evaluation.classification`: accuracy with per-example labels, predictions and
  logits (the heuristic-core paper's in-domain and out-of-distribution accuracy);
- :mod:`~mi_core.evaluation.next_token`: top-1 / top-10 / skip50 accuracy and loss on held-out
  tokens (the separability report's metrics).
"""

from mi_core.evaluation.classification import (
    BATCH_KEYS,
    EvalConfig,
    EvalResult,
    evaluate,
    model_inputs,
    predict_logits,
    results_frame,
    run_eval,
)
from mi_core.evaluation.next_token import METRICS, evaluate_next_token, most_frequent_tokens

__all__ = [
    "BATCH_KEYS",
    "METRICS",
    "EvalConfig",
    "EvalResult",
    "evaluate",
    "evaluate_next_token",
    "model_inputs",
    "most_frequent_tokens",
    "predict_logits",
    "results_frame",
    "run_eval",
]
