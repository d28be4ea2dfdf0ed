"""The control API against hostile input: it checks the token before the body, bounds the body, and
answers bad bodies with a 4xx naming the field, while every other call keeps answering."""

from __future__ import annotations

import socket
import time

import httpx

from tests.integration.conftest import TOKENS, RunningAgent

AUTH = f"Authorization: Bearer {TOKENS['search']}\r\n"


def _connect(agent: RunningAgent) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", agent.port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    return s


def _status(s: socket.socket) -> int:
    head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 "), head
    return int(head.split()[1])


def _headers(length: str, auth: str = "") -> bytes:
    return (
        f"POST /api/v1/workloads HTTP/1.1\r\nHost: x\r\n{auth}"
        f"Content-Type: application/yaml\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def test_no_token_and_too_big_are_refused_before_the_body_is_read(
    tenant_agent: RunningAgent,
) -> None:
    url = tenant_agent.url + "/api/v1"
    # 100 MB announced, 64 KiB sent: the answer comes while the client still has all the rest to
    # send
    for auth, status in (("", 401), ("Authorization: Bearer not-a-token\r\n", 401), (AUTH, 413)):
        with _connect(tenant_agent) as s:
            s.sendall(_headers("104857600", auth) + b"x" * 65536)
            assert _status(s) == status
    # a chunked body gives no length: it is cut off once past the limit (1 MiB by default)
    with _connect(tenant_agent) as s:
        s.sendall(
            b"POST /api/v1/workloads HTTP/1.1\r\nHost: x\r\n"
            + AUTH.encode()
            + b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"%x\r\n%s\r\n" % (65536, b"#" * 65536)
        sent = 0
        s.settimeout(0.05)
        answer = b""
        while sent < 64 << 20 and not answer:
            try:
                s.sendall(chunk)
                sent += 65536
                answer = s.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break  # the agent closed the connection after answering
        s.settimeout(10)
        answer = answer or s.recv(4096)
        assert answer.split()[1] == b"413", answer
        assert (1 << 20) <= sent < (8 << 20)
    # while a client trickles a body in, every other call answers at once
    with _connect(tenant_agent) as slow:
        slow.sendall(_headers("1000", AUTH) + b"apiVersion: gpufrac/v1\n")
        started = time.monotonic()
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        r = httpx.get(url + "/workloads", headers={"authorization": f"Bearer {TOKENS['search']}"})
        assert r.status_code == 200
        assert time.monotonic() - started < 3


def test_bad_bodies_are_4xx_naming_the_field(tenant_agent: RunningAgent) -> None:
    url = tenant_agent.url + "/api/v1"
    search = {"authorization": f"Bearer {TOKENS['search']}"}
    admin = {"authorization": f"Bearer {TOKENS['admin']}"}
    big = "x" * 100_000
    bomb = (
        "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: bomb, tenant: search}\n"
        f"spec:\n  env: {{BIG: &s {big}}}\n  resources: {{gpu: {{fraction: 0.25}}}}\n  "
        f"command: [{', '.join(['*s'] * 200)}]\n"
    )
    deployment = (
        "apiVersion: gpufrac/v1\nkind: Deployment\nmetadata: {name: d, tenant: search}\n"
        "spec: {timeout_seconds: .nan, template: {command: [x], resources: {gpu: "
        "{fraction: 0.25}}}}\n"
    )
    cases = [
        (bomb, "expands to more than"),
        ("[" * 3000 + "]" * 3000, "nested more than"),
        ('{"a": ' * 3000 + "1" + "}" * 3000, "nested more than"),
        ("x: " + "9" * 5000, "more than 18 digits"),
        (deployment, "not a finite number"),
        (
            "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: boss, tenant: search}\n"
            "spec: {priority: 1000000000, command: [x], resources: {gpu: {count: 1}}}\n",
            "for tenant search",
        ),
        (
            deployment.replace("timeout_seconds: .nan, ", "").replace(
                "command: [x],", "command: [x], priority: 1000000000,"
            ),
            "for tenant search",
        ),
        (
            "apiVersion: gpufrac/v1\nkind: Workload\nmetadata: {name: hex, tenant: search}\n"
            "spec: {command: [x], resources: {gpu: {count: 1}}, priority: 0x"
            + "f" * 100_000
            + "}\n",
            "more than 18 digits",  # at spec.priority, before any value is made of it
        ),
    ]
    for text, message in cases:
        started = time.monotonic()
        r = httpx.post(url + "/workloads", content=text, headers=search, timeout=30)
        assert r.status_code == 422, (message, r.text)
        assert message in r.text
        assert time.monotonic() - started < 10
    nothing = httpx.post(url + "/gpus/0/mig", content=b"", headers=admin)
    assert nothing.status_code == 422 and "body" in nothing.text
    # an empty layout body would destroy every idle instance: instances must be said
    empty = httpx.post(url + "/gpus/0/mig", json={}, headers=admin)
    assert empty.status_code == 422 and "instances" in empty.text, empty.text
    scale = httpx.post(url + "/deployments/search/none/scale", content=b"", headers=search)
    assert scale.status_code in (404, 422)
    assert httpx.get(url + "/events?limit=100000000", headers=admin).status_code == 422
    assert httpx.get(url + "/events?after=" + "9" * 26, headers=admin).status_code == 422
    assert httpx.get(url + "/workloads/search/x/logs?tail=-5", headers=search).status_code == 422
    assert httpx.get(url + "/workloads", headers=admin).json()["workloads"] == []
