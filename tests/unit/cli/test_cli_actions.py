"""The one printer of actions: the scheduler's and MIG changes, one line each ("would ..." in a dry
run, the nvidia-smi command under a MIG change where asked), the short form of ``schedule``'s
table, and the MIG changes a placement makes as ``apply`` prints them."""

from __future__ import annotations

from rich.text import Text

from gpufrac.api.schemas import WorkloadResult
from gpufrac.cli.actions import action_lines, changes_text
from gpufrac.cli.agent_cmds import _print_result
from gpufrac.cli.common import console
from gpufrac.model.mig import MigPlacement
from gpufrac.model.migplan import MigAction
from gpufrac.planning.sched_decision import ACTION_KINDS, Decision, SchedAction, decision_to_json

RECUT = MigPlacement(4, "1g.18gb")
MADE = MigPlacement(0, "3g.71gb")
PLACED = Decision(
    "search/big",
    "placed",
    mode="mig",
    gpus=("GPU-0",),
    mig=MADE,
    evicted=("search/low",),
    actions=(
        SchedAction("evict", "search/low", reason="preempted by search/big"),
        SchedAction("destroy_mig_instance", "search/big", "GPU-0", RECUT),
        SchedAction("create_mig_instance", "search/big", "GPU-0", MADE),
        SchedAction("start", "search/big", "GPU-0", MADE),
    ),
)


def plain(lines: list[str]) -> list[str]:
    return [Text.from_markup(line).plain for line in lines]


def test_schedules_table_says_what_changes_before_the_start() -> None:
    assert changes_text(PLACED.actions) == "evict search/low; destroy 1g.18gb@4; create 3g.71gb@0"
    assert changes_text(PLACED.actions[-1:]) == ""  # a start alone changes nothing first


def test_every_kind_prints_as_one_line_and_a_mig_change_with_its_command() -> None:
    every = [SchedAction(kind, "search/big", "GPU-0", MADE, "[red]why") for kind in ACTION_KINDS]
    lines = plain(action_lines(every, dry=True, commands=True))
    assert len(lines) == len(ACTION_KINDS) and all(line.startswith("would ") for line in lines)
    assert "evict search/big: [red]why" in lines[0]  # the text as it is, not Rich markup
    gi = MigAction("create_gi", "GPU-0", 0, "1g.18gb", 0, 19)
    assert plain(action_lines([gi], dry=True, commands=True)) == [
        "would GPU 0: create GPU instance 1g.18gb@0",
        "    nvidia-smi mig -i 0 -cgi 19:0 -C",
    ]
    assert plain(action_lines([gi])) == ["GPU 0: create GPU instance 1g.18gb@0"]


def test_apply_prints_the_mig_changes_its_placement_makes() -> None:
    r = WorkloadResult.model_validate(
        {
            "kind": "Workload",
            "workload": "search/big",
            "result": "created",
            "decision": decision_to_json(PLACED),
            "spec": {},
            "diff": [],
            "warnings": [],
        }
    )
    with console.capture() as shown:
        _print_result(r)
    lines = shown.get().splitlines()
    assert lines[0].startswith("search/big created: placed mig on GPU-0")
    assert lines[1:] == [
        "    destroy MIG instance 1g.18gb@4 on GPU-0",
        "    create MIG instance 3g.71gb@0 on GPU-0",
    ]
