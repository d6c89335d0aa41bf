"""The stage runner the methods share, and the heuristic-core experiment's table of stages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from mi_core.methods.stages import StageOutcome, run_stages


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[list[str]], None]


def _appends(name: str) -> Step:
    return Step(name, lambda ran: ran.append(name))


def test_stages_run_in_order_skipping_those_off_and_those_done():
    done, events, marked, ran = {"b"}, [], [], []
    outcomes = run_stages(
        [_appends("a"), _appends("b"), _appends("c"), _appends("d")],
        ran,
        is_done=lambda name: name in done,
        mark_done=lambda name, seconds: marked.append((name, seconds)),
        on_stage=lambda name, status: events.append((name, status)),
        enabled=lambda name: name != "c",
    )
    assert ran == ["a", "d"]
    assert [(o.name, o.status) for o in outcomes] == [
        ("a", "ran"), ("b", "skipped"), ("c", "off"), ("d", "ran"),
    ]  # fmt: skip
    assert [name for name, _ in marked] == ["a", "d"] and all(s >= 0 for _, s in marked)
    assert [o.seconds for o in outcomes if o.status == "ran"] == [s for _, s in marked]
    assert events == [
        ("a", "start"), ("a", "ran"), ("b", "skipped"), ("c", "off"), ("d", "start"),
        ("d", "ran"),
    ]  # fmt: skip
    assert StageOutcome("x", "off").seconds == 0.0


def test_a_stage_that_fails_is_not_marked_and_stops_the_run():
    def fail(ran: list[str]) -> None:
        raise RuntimeError("stage failed")

    marked, ran = [], []
    with pytest.raises(RuntimeError, match="stage failed"):
        run_stages(
            [_appends("a"), Step("b", fail), _appends("c")],
            ran,
            is_done=lambda name: False,
            mark_done=lambda name, seconds: marked.append(name),
        )
    assert ran == ["a"] and marked == ["a"]


def test_the_heuristic_core_table_runs_each_stage_by_its_function_in_the_layout_s_order():
    from mi_core.methods.heuristic_core import STAGES
    from mi_core.methods.heuristic_core.layout import STAGES as LAYOUT_STAGES
    from mi_core.methods.heuristic_core.stages import STAGE_BY_NAME, STAGE_SPECS

    assert tuple(s.name for s in STAGE_SPECS) == LAYOUT_STAGES == STAGES
    assert set(STAGE_BY_NAME) == set(STAGES)
    for i, spec in enumerate(STAGE_SPECS):
        assert callable(spec.run), spec.name
        # a stage reads only stages that run before it
        assert set(spec.inputs) <= set(STAGES[:i]), spec.name
