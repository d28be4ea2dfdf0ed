"""The scheduler's output as values: decisions and the actions the node agent carries out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufrac.model.mig import MigPlacement
from gpufrac.model.workload import WorkloadSpec


@dataclass(frozen=True, slots=True)
class SchedAction:
    kind: str  # create_mig_instance | evict | start
    workload: str
    gpu_uuid: str | None = None
    mig: MigPlacement | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    workload: str
    outcome: str  # placed | pending | refused
    reason: str = ""
    mode: str | None = None
    gpus: tuple[str, ...] = ()
    mig: MigPlacement | None = None
    evicted: tuple[str, ...] = ()
    actions: tuple[SchedAction, ...] = ()


def decision_to_json(d: Decision) -> dict[str, object]:
    return {
        "workload": d.workload,
        "outcome": d.outcome,
        "reason": d.reason,
        "mode": d.mode,
        "gpus": list(d.gpus),
        "mig": None if d.mig is None else d.mig.to_json(),
        "evicted": list(d.evicted),
        "actions": [
            {
                "kind": a.kind,
                "workload": a.workload,
                "gpu_uuid": a.gpu_uuid,
                "mig": None if a.mig is None else a.mig.to_json(),
            }
            for a in d.actions
        ],
    }


def decision_from_json(raw: dict[str, Any]) -> Decision:
    def pl(x: Any) -> MigPlacement | None:
        return None if x is None else MigPlacement(int(x["start"]), str(x["profile"]))

    return Decision(
        workload=raw["workload"],
        outcome=raw["outcome"],
        reason=raw.get("reason", ""),
        mode=raw.get("mode"),
        gpus=tuple(raw.get("gpus", ())),
        mig=pl(raw.get("mig")),
        evicted=tuple(raw.get("evicted", ())),
        actions=tuple(
            SchedAction(a["kind"], a["workload"], a.get("gpu_uuid"), pl(a.get("mig")))
            for a in raw.get("actions", ())
        ),
    )


def workload_key(spec: WorkloadSpec) -> str:
    return f"{spec.tenant}/{spec.name}"
