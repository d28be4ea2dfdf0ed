"""The control plane's relay of its nodes' series (``cluster.metrics_relay``) against nodes of the
test's on loopback: one that answers, one that never does, one that trickles its answer past the
time a node is given, one that refuses the credential. Each node left out is
``gpufrac_cluster_node_metrics_up 0``, and the series of the one that answered are relayed whole,
within the time one node is given."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpufrac.cluster import metrics_relay
from gpufrac.cluster.control import ControlPlane
from gpufrac.cluster.metrics_relay import NodeMetricsRelay
from gpufrac.model.catalog import lookup_model
from gpufrac.planning.sched_state import SchedGpu
from tests.prom import samples, value

TIMEOUT_S = 2.0  # the answering node answers well within it even with the CPUs busy
PAGE = (
    "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
    'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",Hostname="answers"} 700\n'
    "# TYPE gpufrac_workload_state gauge\n"
    'gpufrac_workload_state{tenant="t",workload="w",phase="running",Hostname="answers"} 1\n'
)


class Node(BaseHTTPRequestHandler):
    """``answers``: its page to its own credential; ``trickles``: a byte at a time, never done;
    ``refuses``: 401, whatever the credential."""

    behaviour = "answers"
    credential = ""

    def do_GET(self) -> None:
        if self.path != "/cluster/v1/metrics":
            self.send_error(404)
        elif self.behaviour == "refuses":
            self.send_error(401)
        elif self.headers.get("authorization") != f"Bearer {self.credential}":
            self.send_error(403)
        elif self.behaviour == "answers":
            body = PAGE.encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_response(200)
            self.send_header("content-length", str(10**6))
            self.end_headers()
            try:
                for _ in range(200):  # 20 s at most, were it not left
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass  # the relay left it

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def control(tmp_path: Path) -> Iterator[ControlPlane]:
    """A control plane with four alive nodes, each at an address of its own kind."""
    control = ControlPlane(tmp_path)
    h200 = lookup_model("h200")
    servers: list[ThreadingHTTPServer] = []
    silent = socket.socket()  # listens, never accepts: the request is sent, no answer comes
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    for name in ("answers", "silent", "trickles", "refuses"):
        if name == "silent":
            address = f"http://127.0.0.1:{silent.getsockname()[1]}"
        else:
            handler = type(name, (Node,), {"behaviour": name})
            server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
            servers.append(server)
            address = f"http://127.0.0.1:{server.server_address[1]}"
        gpu = SchedGpu(f"GPU-{name}", 0, h200, mig=False)
        control.admitted_join(name, control.bootstrap(name), {}, [gpu], address)
        if name != "silent":
            handler.credential = control.credentials[name]  # what the node was given
    try:
        yield control
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
        silent.close()


def test_a_node_that_does_not_answer_in_time_is_down_and_the_others_are_relayed(
    control: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics_relay, "NODE_TIMEOUT_S", TIMEOUT_S)
    assert {n.name for n in control.nodes() if n.state == "alive"} == {
        "answers",
        "silent",
        "trickles",
        "refuses",
    }
    registry = CollectorRegistry()
    registry.register(NodeMetricsRelay(control))
    started = time.monotonic()
    text = generate_latest(registry).decode()
    took = time.monotonic() - started
    # all nodes asked at once: the scrape waits for the slowest up to the time one node is given
    assert took < TIMEOUT_S + 1.0, took
    up = {la["node"]: v for la, v in samples(text, "gpufrac_cluster_node_metrics_up")}
    assert up == {"answers": 1, "silent": 0, "trickles": 0, "refuses": 0}
    # the node that answered: its series whole, each with the node the control plane knows it by
    ((labels, used),) = samples(text, "DCGM_FI_DEV_FB_USED")
    assert (labels["node"], labels["Hostname"], used) == ("answers", "answers", 700)
    assert value(text, "gpufrac_workload_state", node="answers", workload="w") == 1
    # nothing of the others (the trickling one's bytes included)
    nodes = {
        la.get("node")
        for name in ("DCGM_FI_DEV_FB_USED", "gpufrac_workload_state")
        for la, _ in samples(text, name)
    }
    assert nodes == {"answers"}
