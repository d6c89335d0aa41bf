"""Resumable stages run in order: the one stage runner of the methods.

A method lists its stages as specs, each with a ``name`` and a ``run`` callable that takes the
method's context (what the stages share: its config, its output folder, inputs loaded once),
and says how a finished stage is told (``is_done``) and recorded (``mark_done``, e.g. a
done-file with a key of the settings it ran with). :func:`run_stages` runs the stages that are
on and not finished, in order, and reports each one::

    @dataclass(frozen=True)
    class Stage:
        name: str
        run: Callable[[MyContext], None]

    outcomes = run_stages([Stage("fit", fit), Stage("report", report)], context,
                          is_done=lambda name: marker(name).is_file(),
                          mark_done=lambda name, seconds: marker(name).touch())

The heuristic-core experiment runs its stages so
(:class:`~mi_core.methods.heuristic_core.pipeline.HeuristicCoreExperiment`). The separability
method has no stages of this kind: its unit of resumption is a pruning step, each step
carrying the masks of the last in one state file (:func:`~.separability.run.run_separability`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

__all__ = ["StageOutcome", "StageSpec", "run_stages"]

logger = logging.getLogger(__name__)

C = TypeVar("C", contravariant=True)


class StageSpec(Protocol[C]):
    """What the runner needs of a stage: its name and what runs it on the context."""

    @property
    def name(self) -> str: ...

    @property
    def run(self) -> Callable[[C], None]: ...


@dataclass
class StageOutcome:
    """What happened to one stage in this run."""

    name: str
    status: str
    """``"ran"``, ``"skipped"`` (finished before, same key) or ``"off"`` (not part of this
    run)."""
    seconds: float = 0.0


def _quiet(name: str, status: str) -> None:
    return None


def run_stages(
    specs: Iterable[StageSpec[C]],
    context: C,
    *,
    is_done: Callable[[str], bool],
    mark_done: Callable[[str, float], None],
    on_stage: Callable[[str, str], None] = _quiet,
    enabled: Callable[[str], bool] | None = None,
) -> list[StageOutcome]:
    """Run each stage of ``specs`` in order on ``context``, unless it is off (``enabled`` says
    no) or finished before (``is_done``); record each one that ran with ``mark_done(name,
    seconds)``, after it returned, so a stage that fails is not marked.

    ``on_stage(name, status)`` is called when a stage starts (``"start"``) and when it ends
    (``"ran"``, ``"skipped"`` or ``"off"``), e.g. to print progress. Returns what happened to
    every stage, in order.
    """
    outcomes = []
    for spec in specs:
        name = spec.name
        if enabled is not None and not enabled(name):
            outcomes.append(StageOutcome(name, "off"))
            on_stage(name, "off")
            continue
        if is_done(name):
            logger.info("stage %s: finished before, skipped", name)
            outcomes.append(StageOutcome(name, "skipped"))
            on_stage(name, "skipped")
            continue
        on_stage(name, "start")
        logger.info("stage %s: running", name)
        started = time.perf_counter()
        spec.run(context)
        seconds = time.perf_counter() - started
        mark_done(name, seconds)
        outcomes.append(StageOutcome(name, "ran", seconds))
        on_stage(name, "ran")
    return outcomes
