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


class _Chunked(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path != "/stream":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(3):
            part = f"part {i} at {time.time():.3f}\n".encode()
            self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.flush()
            time.sleep(0.3)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__" and sys.argv[1:] == ["chunked"]:
    ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), _Chunked).serve_forever()
