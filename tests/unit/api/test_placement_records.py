"""A workload's placement records end to end: the dataclass (``Decision``, ``Completion``) -> its
JSON -> the API's model (``DecisionJson``, ``CompletedJson``, as the CLI reads answers) -> the
dataclass again, unchanged; the JSON has exactly the model's fields; and the store keeps a record
(with a control plane's node and epoch) as it was given, and reads older ones."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufrac.api.schemas import (
    CompletedJson,
    DecisionJson,
    SchedActionJson,
    WhereJson,
    placement_answer,
)
from gpufrac.api.seen_by import decision_seen_by, placement_seen_by
from gpufrac.api.tokens import ADMIN, Caller
from gpufrac.cluster.node import local_decision
from gpufrac.model.mig import MigPlacement
from gpufrac.model.workload import MODES
from gpufrac.planning.sched_decision import (
    ACTION_KINDS,
    ANOTHER_TENANTS,
    END_PHASES,
    OUTCOMES,
    Completion,
    Decision,
    SchedAction,
    StoredPlacement,
    Where,
    completion_from_json,
    completion_to_json,
    decision_from_json,
    decision_to_json,
)
from gpufrac.runtime.store import Store

names = st.builds(
    "{}/{}".format,
    st.sampled_from(["search", "research"]),
    st.text("abcxyz-09", min_size=1, max_size=6),
)
uuids = st.sampled_from(["GPU-0", "GPU-1", "n1/GPU-0", "n2/GPU-7"])
migs = st.builds(
    MigPlacement, st.integers(0, 7), st.sampled_from(["1g.18gb", "1g.18gb+me", "3g.71gb"])
)
texts = st.text(max_size=16)
actions = st.builds(
    SchedAction,
    kind=st.sampled_from(ACTION_KINDS),
    workload=names,
    gpu_uuid=st.none() | uuids,
    mig=st.none() | migs,
    reason=texts,
)
decisions = st.builds(
    Decision,
    workload=names,
    outcome=st.sampled_from(OUTCOMES),
    reason=texts,
    mode=st.none() | st.sampled_from(MODES),
    gpus=st.lists(uuids, max_size=3).map(tuple),
    mig=st.none() | migs,
    evicted=st.lists(names, max_size=3).map(tuple),
    actions=st.lists(actions, max_size=6).map(tuple),
    cause=st.none() | names,
)
counts = st.none() | st.integers(0, 50)
completions = st.builds(
    Completion,
    phase=st.sampled_from(END_PHASES),
    reason=texts,
    where=st.none()
    | st.builds(
        Where,
        st.none() | st.sampled_from(MODES),
        st.lists(uuids, max_size=2).map(tuple),
        st.none() | migs,
    ),
    attempts=counts,
    restarts=counts,
    evictions=counts,
    exit_code=st.none() | st.integers(-255, 255),
    env=st.dictionaries(st.text("ABC_", min_size=1, max_size=5), texts, max_size=3),
)

# every kind of action in one placement: a re-cut that evicts, and the start (stop: the agent's)
EVERY_KIND = Decision(
    "search/big",
    "placed",
    "",
    "mig",
    ("GPU-0",),
    MigPlacement(0, "3g.71gb"),
    ("research/low",),
    tuple(
        SchedAction(kind, "research/low" if kind == "evict" else "search/big", "GPU-0", mig)
        for kind, mig in zip(
            ACTION_KINDS,
            [None, MigPlacement(4, "1g.18gb"), MigPlacement(0, "3g.71gb"), None, None],
            strict=True,
        )
    ),
    cause=None,
)


def over_http(value: dict[str, object]) -> Any:
    return json.loads(json.dumps(value))


def test_every_kind_of_action_is_in_the_table() -> None:
    assert {a.kind for a in EVERY_KIND.actions} == set(ACTION_KINDS)


@settings(max_examples=80, deadline=None)
@given(decisions)
def test_a_decision_goes_through_the_apis_model_and_back_unchanged(d: Decision) -> None:
    raw = over_http(decision_to_json(d))
    assert set(raw) == set(DecisionJson.model_fields)  # no field the API's model does not name
    assert all(set(a) == set(SchedActionJson.model_fields) for a in raw["actions"])
    read = placement_answer(raw)
    assert isinstance(read, DecisionJson)
    assert decision_from_json(read.model_dump(mode="json")) == d


@settings(max_examples=80, deadline=None)
@given(completions)
def test_a_completion_goes_through_the_apis_model_and_back_unchanged(c: Completion) -> None:
    raw = over_http(completion_to_json(c))
    assert set(raw) == set(CompletedJson.model_fields)
    if raw["where"] is not None:
        assert set(raw["where"]) == set(WhereJson.model_fields)
    read = placement_answer(raw)
    assert isinstance(read, CompletedJson)
    assert completion_from_json(read.model_dump(mode="json")) == c


def test_every_kind_round_trips_and_reads_back_typed() -> None:
    raw = over_http(decision_to_json(EVERY_KIND))
    read = DecisionJson.model_validate(raw)
    assert decision_from_json(read.model_dump(mode="json")) == EVERY_KIND
    assert [a.kind for a in read.actions] == list(ACTION_KINDS)


@pytest.mark.parametrize(
    "stored",
    [
        StoredPlacement(3, EVERY_KIND),
        StoredPlacement(1, EVERY_KIND, node="n1", epoch=17),  # a control plane's placement
        StoredPlacement(2, Decision("search/big", "pending", "no GPU has 40GiB free")),
        StoredPlacement(1, Completion("failed", "exited with 3", None, 2, 1, 0, 3, {"A": "b"})),
        StoredPlacement(  # a control plane's: where it ran and the node; the node has the rest
            1, Completion("succeeded", where=Where("mps", ("n2/GPU-1",))), node="n2"
        ),
    ],
)
def test_the_store_gives_back_the_record_it_was_given(
    tmp_path: Path, stored: StoredPlacement
) -> None:
    store = Store(tmp_path / "state.db")
    store.put_workload("search", "big", {"name": "big"})
    store.set_placement(
        "search", "big", stored.generation, stored.record, node=stored.node, epoch=stored.epoch
    )
    assert store.placement("search", "big") == stored


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (  # completed under an older agent: no counts kept (they are read from its runs)
            {"outcome": "completed", "phase": "succeeded", "reason": ""},
            Completion("succeeded"),
        ),
        (  # ... one that kept attempts but not restarts: each attempt after the first was one
            {"outcome": "completed", "phase": "failed", "attempts": 3, "where": None},
            Completion("failed", attempts=3, restarts=2, evictions=0),
        ),
        (  # an older control plane's
            {
                "outcome": "completed",
                "phase": "succeeded",
                "node": "n1",
                "where": {
                    "mode": "mig",
                    "gpus": ["n1/G"],
                    "mig": {"profile": "1g.18gb", "start": 2},
                },
            },
            Completion("succeeded", where=Where("mig", ("n1/G",), MigPlacement(2, "1g.18gb"))),
        ),
    ],
)
def test_a_completion_an_older_gpufrac_stored_reads_back(
    tmp_path: Path, raw: dict[str, Any], expected: Completion
) -> None:
    store = Store(tmp_path / "state.db")
    store.put_workload("search", "big", {"name": "big"})
    with store.transaction() as db:
        db.execute("INSERT INTO placements VALUES ('search', 'big', 1, ?, 0)", (json.dumps(raw),))
    got = store.placement("search", "big")
    assert got is not None and got.record == expected
    assert got.node == raw.get("node")
    CompletedJson.model_validate(raw)  # and the API's model reads it as it was


def test_a_tenant_sees_no_other_tenants_name_in_a_decision_and_the_admin_all() -> None:
    d = replace(EVERY_KIND, reason="preempted by research/x", cause="research/x")
    seen = decision_seen_by(Caller("search"), d)
    assert seen.cause == ANOTHER_TENANTS and seen.evicted == (ANOTHER_TENANTS,)
    assert seen.reason == f"preempted by {ANOTHER_TENANTS}"
    assert [a.workload for a in seen.actions] == [ANOTHER_TENANTS, *["search/big"] * 4]
    assert decision_seen_by(ADMIN, d) == d
    shown = placement_seen_by(Caller("search"), StoredPlacement(1, d, node="n1", epoch=4))
    assert (shown["cause"], shown["node"], shown["epoch"]) == (ANOTHER_TENANTS, "n1", 4)


def test_a_node_knows_every_gpu_of_a_placement_by_its_own_id() -> None:
    on_node = tuple(a.renamed(gpu="n1/{}".format) for a in EVERY_KIND.actions)
    d = replace(EVERY_KIND, gpus=("n1/GPU-0",), actions=on_node)
    local = local_decision(d)
    assert local.gpus == ("GPU-0",)
    assert {a.gpu_uuid for a in local.actions} == {"GPU-0"}
    assert [a.workload for a in local.actions] == [a.workload for a in d.actions]
