"""The control plane's relay of a workload's logs from the node it runs (or ran) on, bounded so
that no node, however slow or talkative, holds anything else up:

* on the event loop, streamed (``httpx.AsyncClient``): a relay holds no thread while it waits for
  a node (the lookup of where the workload is takes the control plane's lock in a thread of the
  relay's own, never the pool the user API's other routes and the nodes' heartbeats run in);
* the whole of one relay within ``log_relay_deadline`` (the lookup, the connection, every byte),
  else ``errors.TimedOut`` (504), whatever the node trickles;
* at most ``log_relay_max`` bytes read from the node: it is asked for no more (it answers the
  newest lines that fit, ``cluster.node_api``), and one that sends more is refused
  (``errors.Unavailable``) as soon as it has, the rest never read;
* at most ``log_relay_per_tenant`` relays of one tenant's workloads and ``log_relay_per_node``
  from one node under way at once, each tried without waiting: one more is ``errors.Busy`` (429,
  with ``Retry-After``).
"""

from __future__ import annotations

import functools
import ssl

import anyio
import httpx

from gpufrac.cluster.control import ControlPlane
from gpufrac.cluster.node_api import LOG_TYPE, RUN_HEADER, TRUNCATED_HEADER
from gpufrac.errors import TimedOut, Unavailable
from gpufrac.model.settings import SETTINGS_FILE
from gpufrac.planning.views import LogTail
from gpufrac.runtime.log_tail import MIB, LogReads, lines_of

# where a workload's log is: None (no such workload), (None, None, None) before it was placed,
# else its node, the node's address and credential (None where the node gave none)
Source = tuple[str | None, str | None, str | None]


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default TLS context, made once (each client would load the CA bundle again)."""
    return httpx.create_ssl_context()


class LogRelay:
    def __init__(self, control: ControlPlane) -> None:
        self.control = control
        self.bounds = LogReads(control.settings)
        # the lookups' own threads: a relay waits for the lock in none of the API's
        self._lookups = anyio.CapacityLimiter(4)

    async def read(self, tenant: str, name: str, tail: int) -> LogTail | None:
        """The workload's newest output as its node reads it (None: no such workload)."""
        bounds = self.bounds
        deadline = bounds.deadline_s
        where = "the control plane"
        with bounds.per_tenant.taken(tenant):
            try:
                with anyio.fail_after(deadline):
                    found = await anyio.to_thread.run_sync(
                        self._source, tenant, name, limiter=self._lookups
                    )
                    if found is None:
                        return None
                    node, address, credential = found
                    if node is None:
                        return LogTail(run=None)
                    if address is None or credential is None:
                        raise Unavailable(f"node {node} has given no address to read logs from")
                    where = f"node {node}"
                    with bounds.per_node.taken(node):
                        return await self._fetch(node, address, credential, tenant, name, tail)
            except TimeoutError:
                raise TimedOut(
                    f"{where} did not send the logs of {tenant}/{name} within "
                    f"{deadline:g} s (log_relay_deadline in {SETTINGS_FILE}); try again, or ask "
                    "for fewer lines (--tail N)"
                ) from None

    def _source(self, tenant: str, name: str) -> Source | None:
        control = self.control
        key = f"{tenant}/{name}"
        with control.lock:
            if control.store.workload(tenant, name) is None:
                return None
            a = control.core.assigned.get(key)
            node = a.node if a is not None else control.core.ended_on.get(key)
            if node is None:
                return None, None, None
            return node, control.addresses.get(node), control.credentials.get(node)

    async def _fetch(
        self, node: str, address: str, credential: str, tenant: str, name: str, tail: int
    ) -> LogTail:
        cap = self.bounds.max_bytes
        refused = (
            f"node {node} sent more than the {cap // MIB} MiB of logs asked for "
            f"(log_relay_max in {SETTINGS_FILE}); refused, the rest unread"
        )
        try:
            async with (
                httpx.AsyncClient(timeout=self.bounds.deadline_s + 1, verify=_tls()) as client,
                client.stream(
                    "GET",
                    f"{address}/cluster/v1/logs/{tenant}/{name}",
                    params={"tail": tail, "max_bytes": cap},
                    headers={
                        "authorization": f"Bearer {credential}",  # the node's own
                        "accept-encoding": "identity",  # what is read is what is counted
                    },
                ) as r,
            ):
                if r.status_code != 200:
                    raise Unavailable(f"node {node} answered {r.status_code}; try again")
                kind = r.headers.get("content-type", "")
                encoding = r.headers.get("content-encoding", "identity")
                if kind.split(";")[0].strip() != LOG_TYPE.split(";")[0] or encoding != "identity":
                    raise Unavailable(
                        f"node {node} answered what is not its logs ({kind}, {encoding}); is it "
                        "the control plane's version of gpufrac?"
                    )
                declared = r.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > cap:
                    raise Unavailable(refused)
                body = bytearray()
                async for chunk in r.aiter_raw():
                    body += chunk
                    if len(body) > cap:
                        raise Unavailable(refused)
                run = r.headers.get(RUN_HEADER)
                truncated = r.headers.get(TRUNCATED_HEADER) == "true"
        except httpx.HTTPError as e:
            raise Unavailable(f"node {node} does not answer ({e}); try again") from None
        lines = lines_of(body, tail)
        del body  # held once: the bytes, or their lines
        return LogTail(run=run, lines=lines, truncated=truncated)
