"""The control plane's two listeners (the users' API, the node listener) as one client, for tests
that speak both: a path under ``/cluster/v1/`` goes to the node listener, any other to the users'
API, as a node agent and the CLI would each call their own."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi.testclient import TestClient

from gpufrac.cluster.control import ControlPlane
from gpufrac.cluster.control_api import (
    NODE_PATHS,
    create_control_app,
    create_node_listener_app,
)


class Routed:
    def __init__(self, users: httpx.Client, nodes: httpx.Client) -> None:
        self.users, self.nodes = users, nodes

    def request(self, method: str, url: str, **kw: Any) -> httpx.Response:
        client = self.nodes if str(url).startswith(NODE_PATHS) else self.users
        return client.request(method, url, **kw)

    def get(self, url: str, **kw: Any) -> httpx.Response:
        return self.request("GET", url, **kw)

    def post(self, url: str, **kw: Any) -> httpx.Response:
        return self.request("POST", url, **kw)

    def delete(self, url: str, **kw: Any) -> httpx.Response:
        return self.request("DELETE", url, **kw)

    def put(self, url: str, **kw: Any) -> httpx.Response:
        return self.request("PUT", url, **kw)


def control_client(control: ControlPlane, *, cluster_token: str, **users: Any) -> Routed:
    """Both listeners of ``control`` through FastAPI's test client (no server); ``users``: what
    ``create_control_app`` takes."""
    return Routed(
        TestClient(create_control_app(control, **users)),
        TestClient(create_node_listener_app(control, cluster_token=cluster_token)),
    )
