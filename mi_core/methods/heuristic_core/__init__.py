"""The heuristic core (Bhaskar, Friedman and Chen 2024) end to end.

Config, resumable stages, comparison of subnetworks, report::

    from mi_core.methods.heuristic_core import load_config, run_experiment
    result = run_experiment("minilm-mnli-quick", "demo-output/report")
    print(result.report_html)

- :mod:`.config`: the JSON config (shipped ones in ``mi_core/configs``);
- :mod:`.pipeline`: the stages (fine-tune, means, sweep, analysis,
  attention, ablation, effective size, report), each skipped when finished before;
- :mod:`.comparison`: read a sweep directory, compare its subnetworks;
- :mod:`.attention`: attention classes and views of the chosen heads;
- :mod:`.ablation`: the core's ablation table with joint rows;
- :mod:`.effective_size`: effective size over fine-tuning checkpoints;
- :mod:`.results`: every stage's results read back (:class:`ExperimentTables`);
- :mod:`.report`: the self-contained HTML report and its Markdown twin.
"""

from typing import TYPE_CHECKING

from mi_core.lazy import lazy_exports

if TYPE_CHECKING:
    from mi_core.data.pairs import display_name
    from mi_core.methods.heuristic_core.ablation import run_core_ablation
    from mi_core.methods.heuristic_core.attention import (
        attention_classes,
        attention_views,
        choose_heads,
    )
    from mi_core.methods.heuristic_core.comparison import (
        SubnetworkComparison,
        compare_subnetworks,
        write_comparison,
    )
    from mi_core.methods.heuristic_core.config import ExperimentConfig, load_config, shipped_configs
    from mi_core.methods.heuristic_core.effective_size import (
        EffectiveSizeConfig,
        run_effective_size,
        run_effective_size_job,
    )
    from mi_core.methods.heuristic_core.layout import ExperimentLayout
    from mi_core.methods.heuristic_core.pipeline import (
        STAGES,
        ExperimentResult,
        HeuristicCoreExperiment,
        HeuristicCoreResult,
        run_experiment,
        run_heuristic_core,
    )
    from mi_core.methods.heuristic_core.report import (
        build_report,
        render_report,
        write_report,
    )
    from mi_core.methods.heuristic_core.results import ExperimentTables

#: Public name -> the module that defines it (imported on first use).
_NAMES = {
    "run_core_ablation": "mi_core.methods.heuristic_core.ablation",
    "attention_classes": "mi_core.methods.heuristic_core.attention",
    "attention_views": "mi_core.methods.heuristic_core.attention",
    "choose_heads": "mi_core.methods.heuristic_core.attention",
    "SubnetworkComparison": "mi_core.methods.heuristic_core.comparison",
    "compare_subnetworks": "mi_core.methods.heuristic_core.comparison",
    "write_comparison": "mi_core.methods.heuristic_core.comparison",
    "ExperimentConfig": "mi_core.methods.heuristic_core.config",
    "load_config": "mi_core.methods.heuristic_core.config",
    "shipped_configs": "mi_core.methods.heuristic_core.config",
    "EffectiveSizeConfig": "mi_core.methods.heuristic_core.config",
    "run_effective_size": "mi_core.methods.heuristic_core.effective_size",
    "run_effective_size_job": "mi_core.methods.heuristic_core.effective_size",
    "ExperimentLayout": "mi_core.methods.heuristic_core.layout",
    "STAGES": "mi_core.methods.heuristic_core.pipeline",
    "ExperimentResult": "mi_core.methods.heuristic_core.pipeline",
    "HeuristicCoreExperiment": "mi_core.methods.heuristic_core.pipeline",
    "HeuristicCoreResult": "mi_core.methods.heuristic_core.pipeline",
    "run_experiment": "mi_core.methods.heuristic_core.pipeline",
    "run_heuristic_core": "mi_core.methods.heuristic_core.pipeline",
    "build_report": "mi_core.methods.heuristic_core.report",
    "display_name": "mi_core.data.pairs",
    "render_report": "mi_core.methods.heuristic_core.report",
    "write_report": "mi_core.methods.heuristic_core.report",
    "ExperimentTables": "mi_core.methods.heuristic_core.results",
}
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)


__all__ = [
    "STAGES",
    "EffectiveSizeConfig",
    "ExperimentConfig",
    "ExperimentTables",
    "ExperimentLayout",
    "ExperimentResult",
    "HeuristicCoreExperiment",
    "HeuristicCoreResult",
    "SubnetworkComparison",
    "attention_classes",
    "attention_views",
    "build_report",
    "choose_heads",
    "compare_subnetworks",
    "display_name",
    "load_config",
    "run_core_ablation",
    "run_effective_size",
    "run_effective_size_job",
    "run_experiment",
    "run_heuristic_core",
    "shipped_configs",
    "write_comparison",
    "render_report",
    "write_report",
]
