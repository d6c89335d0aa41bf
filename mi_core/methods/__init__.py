"""The methods of the sources, each composed from the building blocks of mi_core.

- :mod:`~mi_core.methods.heuristic_core`: "The Heuristic Core" (Bhaskar, Friedman and Chen 2024):
  pruned subnetworks over seeds and sparsities, their shared core, attention classes, ablations,
  effective size over fine-tuning;
- :mod:`~mi_core.methods.separability`: separability of capabilities (the report on OPT /
  Galactica): iterative neuron pruning by activation statistics, trajectories and their area.

Building blocks (models, data, interventions, pruning, analysis, statistics, viz) import nothing
from here.
"""
