"""Models and servers the serving tests deploy (run from the repository root, as replica workdir).

* ``batch_sizes``: a factory for the replica server; each output is the size of the batch its input
  came in, so a test sees batching happen.
* ``python -m tests.integration.serving_fixtures chunked``: a plain HTTP server on ``$PORT`` (a
  ``command:`` deployment) whose ``/stream`` answers in three chunks, 0.3 s apart.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def batch_sizes() -> Callable[[list[object]], list[int]]:
    def run(batch: list[object]) -> list[int]:
        time.sleep(0.02)
        return [len(batch)] * len(batch)

    return run


def stream_chunks(handler: BaseHTTPRequestHandler, part: Callable[[int], str], gap: float) -> None:
    """Answer 200 in three chunks, ``gap`` seconds apart."""
    handler.send_response(200)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    for i in range(3):
        data = part(i).encode()
        handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        handler.wfile.flush()
        time.sleep(gap)
    handler.wfile.write(b"0\r\n\r\n")


class _Chunked(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path != "/stream":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        stream_chunks(self, lambda i: f"part {i} at {time.time():.3f}\n", 0.3)

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__" and sys.argv[1:] == ["chunked"]:
    ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), _Chunked).serve_forever()
