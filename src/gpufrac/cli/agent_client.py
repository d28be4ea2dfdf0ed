"""The CLI's side of the agent's API: finding the agent, calling it, reading its answers.

An agent is found by ``--server``, then ``$GPUFRAC_SERVER``, then the agent running on the data
directory (it writes where it listens to ``DATA_DIR/agent.json``), then one answering on the default
port. Answers map to exit codes: 2 for bad input (422), 1 for a refusal or something not found.
Answers are read with the API's own models (``gpufrac.api.schemas``, what ``/openapi.json``
describes): ``call_as`` and ``read_as``. ``--json`` prints the answer as it came. httpx and the
models are imported by the calls that use them, not with the CLI (``cli/common.py``).
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from gpufrac.cli.common import err_console, fail
from gpufrac.config import TOKEN_ENV
from gpufrac.config import data_dir as resolve_data_dir

if TYPE_CHECKING:
    import ssl

    import httpx
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")

DEFAULT_PORT = 8470
ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server", help="The agent's address (default: $GPUFRAC_SERVER or http://127.0.0.1:8470)."
    ),
]
AGENT_FILE = "agent.json"


def agent_holds(data: Path) -> bool:
    """Whether a running agent (or ``gpufrac up``) holds this data directory."""
    lock = data / "agent.lock"
    if not lock.exists():
        return False
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def find_agent(server: str | None, *, probe: bool = True, data: Path | None = None) -> str | None:
    """The address of a running agent: the one named, else the one running on ``data`` (it says
    where in ``agent.json``), else (with ``probe``) one answering on the default port."""
    named = server or os.environ.get("GPUFRAC_SERVER")
    if named:
        return named.rstrip("/")
    if data is not None and agent_holds(data):
        try:
            url = json.loads((data / AGENT_FILE).read_text()).get("url")
        except (OSError, ValueError, AttributeError):
            url = None
        if isinstance(url, str):
            return url.rstrip("/")
    if not probe:
        return None
    import httpx

    url = f"http://127.0.0.1:{DEFAULT_PORT}"
    try:
        if httpx.get(url + "/api/v1/health", timeout=0.3, verify=_tls()).status_code == 200:
            return url
    except httpx.HTTPError:
        return None
    return None


def _server(server: str | None) -> str:
    """``--server``, else ``$GPUFRAC_SERVER``, else the agent running on the data directory
    (``$GPUFRAC_DATA_DIR`` or the default), else the default port."""
    found = find_agent(server, probe=False, data=resolve_data_dir(None))
    return found or f"http://127.0.0.1:{DEFAULT_PORT}"


def send(method: str, server: str | None, path: str, **kw: Any) -> httpx.Response:
    """One call to the agent, with the caller's token; raises ``httpx.HTTPError`` when the agent
    cannot be reached (what watching commands wait out)."""
    import httpx

    url = _server(server) + path
    token = os.environ.get(TOKEN_ENV)
    headers = {**kw.pop("headers", {}), **({"authorization": f"Bearer {token}"} if token else {})}
    timeout = kw.pop("timeout", 30)
    return httpx.request(method, url, timeout=timeout, headers=headers, verify=_tls(), **kw)


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's CA bundle, or $SSL_CERT_FILE / $SSL_CERT_DIR), made
    once a process: each call would load the bundle again, tens of milliseconds every time."""
    import httpx

    return httpx.create_ssl_context()


def agent_address(server: str | None) -> str:
    """Where calls to the agent go now (for messages)."""
    return _server(server)


WAIT_429_S = 30.0  # the longest the CLI waits out a server's 429s (its Retry-After) in all


def request(
    method: str, server: str | None, path: str, *, wait_busy: bool = False, **kw: Any
) -> httpx.Response:
    """One call to the agent, with the caller's token; an agent that cannot be reached is exit 2.
    With ``wait_busy`` (an apply), a 429 (too many of this tenant's calls: nothing was done) is
    waited out as its Retry-After says, up to ``WAIT_429_S`` in all, saying so once; then it is
    the answer."""
    import time

    import httpx

    waited = 0.0
    while True:
        try:
            r = send(method, server, path, **kw)
        except httpx.HTTPError as e:
            raise fail(
                f"cannot reach the agent at {_server(server)} ({e})",
                2,
                "start it with: gpufrac agent, or say where it is: --server URL or $GPUFRAC_SERVER",
            ) from None
        after = r.headers.get("retry-after", "1")
        pause = (
            float(after) if r.status_code == 429 and after.isascii() and after.isdigit() else 1.0
        )
        if not wait_busy or r.status_code != 429 or waited + pause > WAIT_429_S:
            return r
        if not waited:
            err_console.print(
                f"the server asks to wait ({_detail(r, '; ')}): trying again in {pause:g} s",
                highlight=False,
            )
        time.sleep(pause)
        waited += pause


def token_hint(status: int) -> str | None:
    """What to do about a 401 or 403 (None for any other answer): every command sends the token in
    ``$GPUFRAC_TOKEN``."""
    given = bool(os.environ.get(TOKEN_ENV))
    if status == 401 and not given:
        return (
            f"the agent takes API tokens: set {TOKEN_ENV} to one (export {TOKEN_ENV}=...; the "
            "operator's tokens.yaml in the agent's data directory lists them)"
        )
    if status == 401:
        return (
            f"the agent does not take the token in {TOKEN_ENV}: check it against the agent's "
            "tokens.yaml"
        )
    if status == 403:
        return (
            f"the token in {TOKEN_ENV} may not do this: use the admin's token, or one of the "
            "tenant named"
        )
    return None


def answer_detail(r: httpx.Response, sep: str = "; ") -> str:
    """The agent's explanation of a refusal (each problem of a 422 separated by ``sep``); for a
    token's refusal (401, 403), what to do about ``$GPUFRAC_TOKEN``."""
    hint = token_hint(r.status_code)
    said = _detail(r, sep)
    return f"{said} ({hint})" if hint else said


def _detail(r: httpx.Response, sep: str) -> str:
    try:
        detail = r.json().get("detail", r.text)
    except ValueError:
        return r.text
    if isinstance(detail, list):
        return sep.join(
            f"{_located(d.get('loc', []))}: {d.get('msg')}"
            + (f" ({d['fix']})" if d.get("fix") else "")
            for d in detail
            if isinstance(d, dict)
        )
    return str(detail)


def _located(loc: list[Any]) -> str:
    """A problem's location as the manifest reader writes it: ``doc[2].spec.mounts[0].source``."""
    out = ""
    for part in loc:
        text = str(part)
        out += f"[{text}]" if text.isdigit() and out else f"{'.' if out else ''}{text}"
    return out


def call(method: str, server: str | None, path: str, **kw: Any) -> Any:
    return answer(request(method, server, path, **kw))


def answer(r: httpx.Response) -> Any:
    """The agent's JSON answer, or exit: 2 for bad input (422), 1 for a refusal, not found, too
    busy (429: its detail, and when to try again) or a node that did not answer (503, 504)."""
    if r.status_code == 422:
        raise fail(answer_detail(r, sep="\n") or r.text, 2)
    if r.status_code == 409:
        raise fail(r.json().get("detail", "refused"), 1)
    if r.status_code in (401, 403):
        raise fail(_detail(r, "; ") or "refused", 1, token_hint(r.status_code))
    if r.status_code == 404:
        raise fail(r.json().get("detail", "not found"), 1)
    if r.status_code == 413:  # a body or manifest over the server's bounds: split it
        raise fail(_detail(r, "; ") or "too large", 2)
    if r.status_code == 501:  # what this server lacks (a cluster's control plane: MIG layouts)
        raise fail(_detail(r, "; ") or "not supported by this server", 1)
    if r.status_code == 429:  # too many such calls under way (a tenant's log reads): not started
        after = r.headers.get("retry-after", "a few")
        said = _detail(r, "; ") or f"the server is busy; try again in {after} s"
        raise fail(said, 1, f"the server said to try again after {after} s (Retry-After)")
    if r.status_code in (503, 504):  # a node that did not answer, or not in time; a full disk
        raise fail(_detail(r, "; ") or f"the server could not answer now ({r.status_code})", 1)
    if r.status_code >= 400:
        raise fail(f"the agent answered {r.status_code}: {r.text}", 1)
    return r.json()


def call_as(model: type[M], method: str, server: str | None, path: str, **kw: Any) -> M:
    """The agent's answer read as ``model``; exits as ``answer`` does."""
    return read_as(model, call(method, server, path, **kw))


def read_as(model: type[M], got: Any) -> M:
    """An answer read as ``model``: one that is not its shape (an agent of another version, or not
    an agent) is exit 1, naming the field."""
    from pydantic import ValidationError

    try:
        return model.model_validate(got)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "the answer"
        raise fail(
            f"the agent's answer is not what this gpufrac reads: {where}: {first['msg']}",
            1,
            "use a gpufrac of the agent's version",
        ) from None
