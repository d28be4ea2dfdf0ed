"""What every command shares: options, output, and turning errors into exit codes.

Exit codes: 0 success, 1 a check failed or the devices refused, 2 bad input or no driver.

Every ``gpufrac`` call imports the command modules (Typer reads each command's signature), so they
import at their top only what is cheap (Typer, Rich's console, gpufrac's options and errors); each
command imports what it uses (the devices, httpx, the API's models, the agent) in its body
(tests/unit/cli/test_light_imports.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from gpufrac.config import DEMO_FLEET, data_dir, simulate_spec
from gpufrac.errors import GpufracError, InputError

if TYPE_CHECKING:
    from gpufrac.devices import NvmlDevices
    from gpufrac.model.settings import OperatorSettings

# piped (a CI log, `| grep`, `| tee`): lines are not wrapped at 80 columns, and tables get room to
# keep each row on one line (COLUMNS, when set, still decides)
_PIPED = not sys.stdout.isatty() and "COLUMNS" not in os.environ
console = Console(soft_wrap=_PIPED, width=240 if _PIPED else None)
err_console = Console(stderr=True, soft_wrap=True)
F = TypeVar("F", bound=Callable[..., Any])

SimulateOpt = Annotated[
    str | None,
    typer.Option(
        "--simulate",
        help="Use simulated GPUs: MODEL[:COUNT][:mig],... e.g. h200:1:mig,h200:1 "
        "(default: $GPUFRAC_SIMULATE, else the real driver).",
        show_default=False,
    ),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Where gpufrac keeps state (default: $GPUFRAC_DATA_DIR or ~/.local/share/gpufrac).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def _shown(text: str) -> str:
    """Text for the terminal: control characters (an escape sequence a sender put in a name)
    written as \\xNN, never acted on; line breaks and tabs stay."""
    return "".join(
        f"\\x{ord(c):02x}" if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F else c
        for c in text
    )


def fail(message: str, code: int, hint: str | None = None) -> typer.Exit:
    # a message is text, never markup: "[prefix/]name" in a fix is shown as written
    err_console.print(f"[bold red]error:[/] {escape(_shown(message))}", highlight=False)
    if hint:
        err_console.print(f"[yellow]hint:[/] {escape(_shown(hint))}", highlight=False)
    return typer.Exit(code)


@contextmanager
def handled_errors() -> Iterator[None]:
    """Turn gpufrac's errors into a message on stderr and the documented exit code."""
    try:
        yield
    except InputError as e:
        raise fail(str(e), 2) from None
    except GpufracError as e:
        # the devices' errors: their module is loaded once one was raised
        from gpufrac.devices.errors import DeviceError, DriverUnavailable

        if isinstance(e, DriverUnavailable):
            raise fail(e.message, 2, e.hint) from None
        if isinstance(e, DeviceError):
            raise fail(e.message, 1, e.hint) from None
        raise


@contextmanager
def devices(simulate: str | None, data: Path | None) -> Iterator[NvmlDevices]:
    """The device adapter the options ask for; closed afterwards."""
    from gpufrac.devices import open_devices

    spec = simulate_spec(simulate)
    dev = open_devices(spec, data_dir(data))
    try:
        if dev.simulated:
            err_console.print(f"[dim]simulated GPUs: {spec}[/]", highlight=False)
        yield dev
    finally:
        dev.close()


def devices_or_simulated(simulate: str | None, data: Path | None) -> NvmlDevices:
    """The real GPUs, or (for demo and up only) the demo's simulated fleet with a visible notice."""
    from gpufrac.devices import DriverUnavailable, open_simulated
    from gpufrac.devices.nvml import open_real_nvml

    spec = simulate_spec(simulate)
    if spec:
        return open_simulated(spec, data_dir(data))
    try:
        return open_real_nvml()
    except DriverUnavailable as e:
        err_console.print(
            f"[bold yellow]notice:[/] {e.message}; using simulated GPUs ({DEMO_FLEET}).",
            highlight=False,
        )
        return open_simulated(DEMO_FLEET, data_dir(data))


def serve_http(app: Any, host: str, port: int, *, name: str, after: str = "") -> None:
    """Serve ``app`` (uvicorn) until ^C or SIGTERM, then return through the caller's clean-up.
    uvicorn re-raises the signal it caught once it has shut down; under Python's default action
    a SIGTERM would kill the process right there, skipping every ``finally`` of the caller (local
    node agents left running, files left behind), so SIGTERM is turned into ``SystemExit``.

    The signal is said on stderr as it comes (``NAME: stopping (SIGTERM) ...``) and the end once
    the server has shut down (``NAME: stopped``, then ``after``), so whoever stopped it sees it
    go."""
    import signal

    import uvicorn

    from gpufrac.api.head_timeout import HeadTimeoutProtocol

    def terminated(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                err_console.print(
                    f"{name}: stopping ({signal.Signals(sig).name}) ...", highlight=False
                )
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", http=HeadTimeoutProtocol
    )
    server = Server(config)
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        server.run()
    except KeyboardInterrupt:  # ^C: the shutdown is done (as uvicorn.run takes it)
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if server.should_exit:
            err_console.print(f"{name}: stopped{after}", highlight=False)
    if not server.started:  # it could not listen (uvicorn said why): as uvicorn.run exits
        raise SystemExit(3)


def note_preemption_default(settings: OperatorSettings, tenants: Iterable[str | None]) -> None:
    """Once at start (``gpufrac agent``, ``gpufrac control``): each tenant known here (the
    settings', the API tokens', those with stored work) that has no preemption setting of its own,
    whose workloads now evict only their own tenant's, and how to keep the old behaviour."""
    from gpufrac.model.settings import preemption_notes

    for line in preemption_notes(settings, [t for t in tenants if t]):
        err_console.print(f"[yellow]note:[/] {line}", highlight=False)
