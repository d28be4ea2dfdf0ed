"""How every command prints actions: the scheduler's (``SchedAction``: evictions, MIG instances
destroyed and created, starts, stops) and the MIG changes of a plan (``MigAction``).

``print_actions`` prints one line per action, "would ..." in a dry run, with a MIG change's
nvidia-smi command under it where asked (``mig apply`` and its dry run, on the GPUs or through
an agent; ``apply`` and ``up``, for the MIG changes a placement makes; the demo);
``changes_text`` is the short form of what a placement changes before its start, for ``gpufrac
schedule``'s table. Each tells the kinds apart with ``match`` and
``assert_never``, so a kind added to ``ActionKind`` or ``MigActionKind`` and not printed fails
mypy here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, assert_never

from rich.markup import escape

from gpufrac.cli.common import console

if TYPE_CHECKING:  # imported by the commands that print actions, when they do
    from gpufrac.model.migplan import MigAction
    from gpufrac.planning.sched_decision import SchedAction


def action_lines(
    actions: Iterable[SchedAction | MigAction], *, dry: bool = False, commands: bool = False
) -> list[str]:
    """One line per action (Rich markup), ``would ...`` in a dry run; with ``commands``, a MIG
    change's nvidia-smi command on the line under it."""
    from gpufrac.model.migplan import MigAction
    from gpufrac.planning.sched_decision import SchedAction

    out = []
    for a in actions:
        out.append(("would " if dry else "") + escape(a.describe()))
        match a:
            case MigAction():
                if commands:
                    out.append(f"    [dim]{escape(a.nvidia_smi())}[/]")
            case SchedAction():
                pass  # the agent's own steps: no nvidia-smi equivalent
            case _:
                assert_never(a)
    return out


def print_actions(
    actions: Iterable[SchedAction | MigAction],
    *,
    dry: bool = False,
    commands: bool = False,
    indent: str = "",
) -> None:
    for line in action_lines(actions, dry=dry, commands=commands):
        console.print(indent + line, highlight=False)


def changes_text(actions: Sequence[SchedAction]) -> str:
    """What a placement changes before its start, in short: ``evict a/x, a/y; destroy
    1g.18gb@0; create 3g.71gb@4``."""
    evict: list[str] = []
    destroy: list[str] = []
    create: list[str] = []
    for a in actions:
        match a.kind:
            case "evict":
                evict.append(a.workload)
            case "destroy_mig_instance":
                destroy.append(str(a.mig))
            case "create_mig_instance":
                create.append(str(a.mig))
            case "start" | "stop":
                pass  # the start itself (and a stop) is no change made before the start
            case _:
                assert_never(a.kind)
    parts = [("evict", evict), ("destroy", destroy), ("create", create)]
    return "; ".join(f"{verb} {', '.join(names)}" for verb, names in parts if names)
