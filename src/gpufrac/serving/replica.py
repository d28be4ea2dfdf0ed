"""The replica server: serves ``model: package.module:factory`` as JSON over HTTP on ``$PORT``.

``python -m gpufrac.serving.replica package.module:factory [--port P] [--max-batch-size N]
[--max-wait-ms W]``. The factory is called once; what it returns is adapted:

* a PyTorch ``nn.Module``: inputs become a tensor on the module's device (the GPU when there is
  one), run under ``torch.inference_mode()``, outputs come back as lists;
* an ONNX Runtime ``InferenceSession``: inputs become a float32 array fed to its first input;
* any other callable: called with the inputs as they are.

``POST /predict`` (or ``POST /``) takes ``{"inputs": X}`` and answers ``{"outputs": Y}``; ``GET
/healthz`` answers 200 once the model is loaded. With ``--max-batch-size`` above 1, concurrent
requests are batched: the first request of a batch waits at most ``--max-wait-ms`` for others, then
the model is called once with the list of their inputs and must return one output per input; batches
run in one worker thread, so the event loop keeps taking requests meanwhile. Without batching the
model is called on the event loop, one request at a time, as the request is parsed: no task, no
thread hop. The loop is uvloop's where it is installed (``http11.run``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import importlib
import json
import os
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpufrac.serving.http11 import (
    KEY_HEADER,
    HttpConnection,
    HttpError,
    Request,
    error_response,
    json_response,
    keep_task,
    run,
)

Model = Callable[[Any], Any]


def load_factory(ref: str) -> Any:
    """``package.module:factory`` to what the factory returns."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{ref!r} is not package.module:factory")
    sys.path.insert(0, os.getcwd())
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target()


def adapt(obj: Any) -> Model:
    """A callable from inputs (one, or a batch as a list) to outputs, whatever the factory gave."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.nn.Module):
        try:
            device = next(obj.parameters()).device
        except StopIteration:
            device = torch.device("cpu")
        obj.eval()

        def run_torch(inputs: Any) -> Any:
            with torch.inference_mode():
                out = obj(torch.as_tensor(inputs, device=device))
            return out.tolist() if hasattr(out, "tolist") else out

        return run_torch
    ort = sys.modules.get("onnxruntime")
    if ort is not None and isinstance(obj, ort.InferenceSession):
        import numpy

        name = obj.get_inputs()[0].name

        def run_onnx(inputs: Any) -> Any:
            return obj.run(None, {name: numpy.asarray(inputs, dtype=numpy.float32)})[0].tolist()

        return run_onnx
    if not callable(obj):
        raise TypeError(f"the factory returned {type(obj).__name__}, which is not callable")
    return obj  # type: ignore[no-any-return]


class Batcher:
    """Collects concurrent requests into one model call of up to ``size`` inputs."""

    def __init__(self, model: Model, pool: ThreadPoolExecutor, size: int, wait_s: float) -> None:
        self.model, self.pool, self.size, self.wait_s = model, pool, size, wait_s
        self.pending: list[tuple[Any, asyncio.Future[Any]]] = []
        self.flush_at: asyncio.TimerHandle | None = None

    async def __call__(self, inputs: Any) -> Any:
        loop = asyncio.get_running_loop()
        if self.size <= 1:
            return self.model(inputs)  # one at a time: no thread hop on the way
        fut: asyncio.Future[Any] = loop.create_future()
        self.pending.append((inputs, fut))
        if len(self.pending) >= self.size:
            self._flush()
        elif self.flush_at is None:
            self.flush_at = loop.call_later(self.wait_s, self._flush)
        return await fut

    def _flush(self) -> None:
        if self.flush_at is not None:
            self.flush_at.cancel()
            self.flush_at = None
        batch, self.pending = self.pending, []
        if batch:
            keep_task(asyncio.ensure_future(self._run(batch)))

    async def _run(self, batch: list[tuple[Any, asyncio.Future[Any]]]) -> None:
        loop = asyncio.get_running_loop()
        try:
            outputs = await loop.run_in_executor(self.pool, self.model, [i for i, _ in batch])
            if len(outputs) != len(batch):
                raise ValueError(
                    f"the model returned {len(outputs)} outputs for {len(batch)} inputs"
                )
        except Exception as e:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, fut), out in zip(batch, outputs, strict=True):
            if not fut.done():
                fut.set_result(out)


class _Conn(HttpConnection):
    # the key its gateway sends with each request ($GPUFRAC_REPLICA_KEY, set by gpufrac): with
    # one, a request without it (from anything else that reaches the port) is refused
    key: bytes | None = None

    def __init__(self, batcher: Batcher) -> None:
        super().__init__()
        self.batcher = batcher

    def handle(self, req: Request) -> Awaitable[None] | None:
        path = req.target.split("?", 1)[0]  # a query string is the model's business, not a path
        if req.method in ("GET", "HEAD") and path in ("/healthz", "/health"):
            self.send(json_response(200, {"status": "ok"}, keep_alive=req.keep_alive), req)
            return None
        if self.key is not None:
            given = next((v for k, v in req.headers if k.lower() == KEY_HEADER), b"")
            if not hmac.compare_digest(given, self.key):
                self.send(error_response(403, "only through the gpufrac gateway"), req)
                return None
        if req.method != "POST" or path not in ("/", "/predict"):
            self.send(error_response(404, 'POST /predict with {"inputs": ...}'), req)
            return None
        if self.batcher.size <= 1:  # the model runs here, on the loop: no task, no thread hop
            try:
                out = json_response(200, {"outputs": self.batcher.model(_inputs(req))})
            except Exception as e:
                out = _failure(e)
            self.send(out, req)
            return None
        return self._predict(req)

    async def _predict(self, req: Request) -> None:
        try:
            out = json_response(200, {"outputs": await self.batcher(_inputs(req))})
        except Exception as e:
            out = _failure(e)
        self.send(out, req)


def _inputs(req: Request) -> Any:
    payload = json.loads(req.body)
    if not isinstance(payload, dict) or "inputs" not in payload:
        raise HttpError(400, 'the body must be {"inputs": ...}')
    return payload["inputs"]


def _failure(e: Exception) -> bytes:
    """The answer to a request the model could not answer."""
    if isinstance(e, HttpError):
        return error_response(e.status, str(e))
    if isinstance(e, ValueError):
        return error_response(400, f"bad JSON: {e}")
    return error_response(500, f"{type(e).__name__}: {e}")


async def serve(
    model: Model, port: int, max_batch_size: int, max_wait_ms: float, host: str = "127.0.0.1"
) -> None:
    pool = ThreadPoolExecutor(1, thread_name_prefix="model")
    batcher = Batcher(model, pool, max_batch_size, max_wait_ms / 1000)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(batcher), host, port, backlog=1024)
    print(f"serving on {host}:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpufrac.serving.replica")
    p.add_argument("model", help="package.module:factory")
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    p.add_argument(
        "--host",
        default=os.environ.get("GPUFRAC_HOST", "127.0.0.1"),
        help="address to listen on (default: $GPUFRAC_HOST, which gpufrac sets: its node's "
        "address on a cluster, 127.0.0.1 on one machine)",
    )
    p.add_argument("--max-batch-size", type=int, default=1)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    args = p.parse_args(argv)
    key = os.environ.get("GPUFRAC_REPLICA_KEY")
    _Conn.key = key.encode() if key else None
    model = adapt(load_factory(args.model))
    with contextlib.suppress(KeyboardInterrupt):
        run(serve(model, args.port, args.max_batch_size, args.max_wait_ms, args.host))
    return 0


if __name__ == "__main__":
    sys.exit(main())
