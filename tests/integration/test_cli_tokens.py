"""The CLI against a real agent with API tokens on: ``gpufrac load`` sends a token (``--token``,
``$GPUFRAC_TOKEN``, or curl's ``-H``) and counts the answers by status, open loop with ``--rate``;
a refused token stops the load and says what to give; any command's 401 names
``$GPUFRAC_TOKEN``; and the agent says when it stops on SIGTERM."""

from __future__ import annotations

import json
import signal
import sys

from typer.testing import CliRunner

from gpufrac.cli.app import app
from tests.integration.conftest import TOKENS, RunningAgent

runner = CliRunner()
MANIFEST = json.dumps(
    {
        "apiVersion": "gpufrac/v1",
        "kind": "Workload",
        "metadata": {"name": "pinged", "tenant": "research"},
        "spec": {
            "command": [sys.executable, "-c", "pass"],
            "resources": {"gpu": {"memory": "1Gi"}},
        },
    }
)


def load(agent: RunningAgent, *args: str, token: str | None = None) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    env = {"GPUFRAC_TOKEN": token or "", "COLUMNS": "200"}
    url = agent.url + "/api/v1/workloads"  # a POST the agent answers 200 to, with a token
    r = runner.invoke(app, ["load", url, "--body", MANIFEST, "--json", *args], env=env)
    return r.exit_code, json.loads(r.stdout), r.stderr


def test_load_sends_its_token_counts_answers_by_status_and_stops_on_a_refused_one(
    tenant_agent: RunningAgent,
) -> None:
    # open loop, the token from $GPUFRAC_TOKEN: 20 requests sent on schedule in one second
    code, got, _ = load(tenant_agent, "--rate", "20", "--step", "1", token=TOKENS["research"])
    assert code == 0, got
    (row,) = got["steps"]
    assert row["rate_asked"] == 20 and row["requests"] == 20
    # each answer counted by its status: 200s, and 429s where the CPUs were too busy for the
    # tenant's applies to end before the next began (max_concurrent_applies)
    assert got["statuses"] == row["statuses"] and sum(row["statuses"].values()) == 20
    assert set(row["statuses"]) <= {"200", "429"} and row["statuses"].get("200", 0) >= 2, row
    # no token: every answer a 401; the load stops in its first step and names the fix
    code, got, err = load(tenant_agent, "--clients", "1,1", "--step", "2")
    assert code == 1 and len(got["steps"]) == 1, got
    assert list(got["statuses"]) == ["401"] and "GPUFRAC_TOKEN" in err and "--token" in err
    # curl's -H is sent as written: search's token may not apply research's manifest (403)
    bearer = f"Authorization: Bearer {TOKENS['search']}"
    code, got, err = load(tenant_agent, "-H", bearer, "--clients", "1", "--step", "2")
    # (the agent holds a flood of applies off with 429s: those say nothing of the token)
    assert code == 1 and len(got["steps"]) == 1, got
    assert got["statuses"]["403"] > 0 and set(got["statuses"]) <= {"403", "429"}, got
    assert "the token sent was refused" in err
    # a URL with nothing there: every answer a 404; it stops in its first step and says so
    env = {"GPUFRAC_TOKEN": TOKENS["research"], "COLUMNS": "200"}
    nowhere = runner.invoke(
        app,
        ["load", tenant_agent.url + "/serve/nope", "--json", "--clients", "1,1", "--step", "2"],
        env=env,
    )
    assert nowhere.exit_code == 1 and "404" in nowhere.stderr, nowhere.stderr
    assert len(json.loads(nowhere.stdout)["steps"]) == 1
    bad = runner.invoke(app, ["load", tenant_agent.url, "-H", "no colon"])
    assert bad.exit_code == 2 and "-H 'Authorization: Bearer TOKEN'" in bad.stderr
    # (one agent for both halves: each start costs seconds)
    a_refused_token_names_gpufrac_token_and_the_agent_says_it_stops(tenant_agent)


def a_refused_token_names_gpufrac_token_and_the_agent_says_it_stops(
    tenant_agent: RunningAgent,
) -> None:
    env = {"GPUFRAC_SERVER": tenant_agent.url, "COLUMNS": "200"}
    r = runner.invoke(app, ["get", "workloads"], env={**env, "GPUFRAC_TOKEN": ""})
    assert r.exit_code == 1 and "set GPUFRAC_TOKEN" in r.stderr, r.stderr
    r = runner.invoke(app, ["get", "workloads"], env={**env, "GPUFRAC_TOKEN": "not-a-token"})
    assert r.exit_code == 1 and "does not take the token in GPUFRAC_TOKEN" in r.stderr, r.stderr
    r = runner.invoke(app, ["get", "workloads"], env={**env, "GPUFRAC_TOKEN": TOKENS["search"]})
    assert r.exit_code == 0, r.stderr
    # SIGTERM: a line as it stops, one once it has
    tenant_agent.proc.send_signal(signal.SIGTERM)
    tenant_agent.proc.wait(timeout=30)
    log = (tenant_agent.data_dir.parent / "agent.log").read_text()
    assert "gpufrac agent: stopping (SIGTERM) ..." in log, log
    assert "gpufrac agent: stopped (its workloads keep running" in log, log
    assert log.index("stopping (SIGTERM)") < log.index("agent: stopped")
