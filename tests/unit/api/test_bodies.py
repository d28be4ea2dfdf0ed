"""Small bodies are read strictly into their models, and pydantic's errors answer like every other
bad input: the field, what is wrong, the fix; unknown fields named together, per object."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from gpufrac.api.bodies import body_error
from gpufrac.api.schemas import MigBody, ScaleBody
from gpufrac.errors import InputError

BOOL_FIX = "write true or false without quotes"


def problems(model: type[BaseModel], raw: Any) -> list[tuple[str | None, str, str | None]]:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(raw)
    e = body_error(caught.value, model, example="{...}")
    assert isinstance(e, InputError)
    return [(p.field, p.message, p.fix) for p in e.errors]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            {"instances": [], "instancez": [], "mig_enabeld": True},
            [
                (
                    "body",
                    "unknown field(s) 'instancez', 'mig_enabeld'",
                    "use only mig_enabled, instances, drain, allow_mode_change, pin, dry_run",
                )
            ],
        ),
        (
            {"instances": [{"profile": "1g.18gb", "start": 0, "size": 1}]},
            [("instances[0]", "unknown field(s) 'size'", "use only profile, start")],
        ),
        (
            {"instances": [], "drain": "no"},
            [("drain", "must be true or false, not the string 'no'", BOOL_FIX)],
        ),
        (
            {"instances": [], "mig_enabled": 1},
            [("mig_enabled", "must be true or false, not the number 1", BOOL_FIX)],
        ),
        # the layout is exactly the instances: a body without them (which would destroy every
        # idle instance) is refused
        ({}, [("instances", "is missing", "send {...}")]),
        (
            {"instances": [{"profile": "1g.18gb", "start": -1}]},
            [("instances[0].start", "-1 is below 0", "give 0 or more")],
        ),
        (
            {"instances": [{"profile": "1g.18gb", "start": True}]},
            [("instances[0].start", "must be a whole number, not true", "send {...}")],
        ),
        ({"instances": {}}, [("instances", "must be a list, not an object", "send {...}")]),
        ({"instances": [{"start": 0}]}, [("instances[0].profile", "is missing", "send {...}")]),
    ],
)
def test_mig_body_problems(raw: Any, expected: list[tuple[str, str, str]]) -> None:
    assert problems(MigBody, raw) == expected


def test_unknown_fields_come_first_and_every_problem_is_reported() -> None:
    found = problems(MigBody, {"pin": "yes", "x": 1, "instances": [{"profile": 3, "start": 0}]})
    assert [f for f, _, _ in found] == ["body", "instances[0].profile", "pin"]


def test_a_scale_body_takes_a_whole_number_from_0_to_1000() -> None:
    assert ScaleBody.model_validate({"replicas": 3}).replicas == 3
    for bad in (-1, 1001, 2.0, "2", True, None):
        assert [f for f, _, _ in problems(ScaleBody, {"replicas": bad})] == ["replicas"]
    assert [f for f, _, _ in problems(ScaleBody, {})] == ["replicas"]
