"""The heuristic-core experiment end to end: config, resumable stages, comparison, report.

::

    from mi_core.experiment import load_config, run_experiment
    result = run_experiment("minilm-mnli-quick", "demo-output/report")
    print(result.report_html)

- :mod:`~mi_core.experiment.config`: the JSON config (shipped ones in ``mi_core/configs``);
- :mod:`~mi_core.experiment.pipeline`: the stages (fine-tune, means, sweep, analysis,
  attention, ablation, effective size, report), each skipped when finished before;
- :mod:`~mi_core.experiment.comparison`: read a sweep directory, compare its subnetworks;
- :mod:`~mi_core.experiment.attention`: attention classes and views of the chosen heads;
- :mod:`~mi_core.experiment.ablation`: the core's ablation table with joint rows;
- :mod:`~mi_core.experiment.effective_size_run`: effective size over fine-tuning checkpoints;
- :mod:`~mi_core.experiment.report`: the self-contained HTML report and its Markdown twin.
"""

from mi_core.experiment.comparison import (
    SubnetworkComparison,
    SweepResults,
    compare_subnetworks,
    load_sweep,
    write_comparison,
)
from mi_core.experiment.config import ExperimentConfig, load_config, shipped_configs
from mi_core.experiment.effective_size_run import run_effective_size
from mi_core.experiment.pipeline import (
    STAGES,
    ExperimentResult,
    HeuristicCoreExperiment,
    run_experiment,
)
from mi_core.experiment.report import build_report, write_report

__all__ = [
    "STAGES",
    "ExperimentConfig",
    "ExperimentResult",
    "HeuristicCoreExperiment",
    "SubnetworkComparison",
    "SweepResults",
    "build_report",
    "compare_subnetworks",
    "load_config",
    "load_sweep",
    "run_effective_size",
    "run_experiment",
    "shipped_configs",
    "write_comparison",
    "write_report",
]
