"""Evaluation: a classifier's accuracy on pair data sets, a language model's next-token metrics.

- :mod:`~mi_core.evaluation.classification`: accuracy with per-example labels, predictions and
  logits (the heuristic-core paper's in-domain and out-of-distribution accuracy);
- :mod:`~mi_core.evaluation.next_token`: top-1 / top-10 / skip50 accuracy and loss on held-out
  tokens (the separability report's metrics).
"""

from typing import TYPE_CHECKING

from mi_core.lazy import lazy_exports

if TYPE_CHECKING:
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

#: Public name -> the module that defines it (imported on first use).
_NAMES = {
    "BATCH_KEYS": "mi_core.evaluation.classification",
    "EvalConfig": "mi_core.evaluation.config",
    "EvalResult": "mi_core.evaluation.classification",
    "evaluate": "mi_core.evaluation.classification",
    "model_inputs": "mi_core.evaluation.classification",
    "predict_logits": "mi_core.evaluation.classification",
    "results_frame": "mi_core.evaluation.classification",
    "run_eval": "mi_core.evaluation.classification",
    "METRICS": "mi_core.evaluation.next_token",
    "evaluate_next_token": "mi_core.evaluation.next_token",
    "most_frequent_tokens": "mi_core.evaluation.next_token",
}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)


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
