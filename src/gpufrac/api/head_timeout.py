"""The control API's connections: a request head must arrive whole within ``HEAD_TIMEOUT_S``.

uvicorn arms no timer before a request's head is complete (its keep-alive timeout starts only after
a response), so a client that connects and sends nothing, or trickles a header a byte at a time,
holds its connection (a file descriptor of the agent's) for ever; a few thousand of them exhaust the
agent's descriptors without any token. This protocol is uvicorn's httptools one with a timer from
the connection's start, and from each new request's first byte, to the end of its head: a head not
complete by then is answered 408 and the connection closed. A handler's own time, and the body's, do
not count (the API guard bounds the body). And at most ``MAX_CONNECTIONS`` are open at once: one
more is answered 503 and closed at once, so a flood of connections never takes the descriptors the
reconcile loop needs (run directories, shims, the store).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEAD_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 1000  # open at once; beyond it a new connection is answered 503 and closed
_LATE = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


class HeadTimeoutProtocol(HttpToolsProtocol):
    head_timeout_s = HEAD_TIMEOUT_S
    max_connections = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.write(_LATE)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(_FULL)  # the agent's descriptors are not for the taking
            transport.close()
            return
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
