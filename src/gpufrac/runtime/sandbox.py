"""Whom a workload runs as, and what it can reach.

With ``workload_users: tenant`` (the default for an agent that runs as root and has API tokens),
each tenant's workloads run as that tenant's own unprivileged uid and gid (given once from the
operator's ``tenant_uids`` range and kept in the store), with no supplementary groups, in a home
directory of their own (``HOME``, and the working directory unless the manifest gives one) that only
that uid can enter. The data directory is closed to everyone but the agent's user (mode 0700), so no
workload reads the tokens, the store, or another tenant's run directories and logs; what workloads
must reach
(the QoS arbiter's socket, the simulated GPUs' drop box) lives outside it. With ``workload_users:
agent`` (the default otherwise) workloads run as the agent's user and nothing separates tenants from
each other or from the agent; the agent says so at start when it has API tokens.

Tenants' users run the agent's Python (its venv's ``python``, a ``model:`` replica's server) even
where it lives under a directory closed to them (``/root``): through a read-only view of just that
Python in the workload's own mount namespace (``runtime/python_view.py``), checked once at start.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpufrac.errors import InputError
from gpufrac.model.settings import OperatorSettings
from gpufrac.runtime.python_view import PythonView, probe, view_for
from gpufrac.runtime.store import Store

Separation = Literal["agent", "tenant"]


@dataclass(frozen=True, slots=True)
class Identity:
    user: str | int | None  # for the shim: a name (spec.user) or a uid; None: the agent's
    group: int | None
    env: dict[str, str]  # HOME, where it has one of its own
    workdir: str | None  # the default working directory
    view: PythonView = field(default_factory=PythonView)  # what of the agent's Python it is shown


@dataclass(frozen=True, slots=True)
class TenantsPython:
    """Whether tenants' users can run the agent's Python, and how."""

    view: PythonView  # empty: they reach it as it is (or the view did not work)
    problem: str | None  # why they cannot run it; None: they can


def tenants_python(executable: str, uid: int) -> TenantsPython:
    """How users such as ``uid`` run ``executable``: as it is, where every directory on its way is
    open to them, else through a view of it; each checked by running it as ``uid``."""
    try:
        view = view_for(executable)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return TenantsPython(PythonView(), f"cannot list the directories it reads from: {e}")
    problem = probe(executable, view, uid)
    if problem is None:
        return TenantsPython(view, None)
    if view.covers:
        problem = f"{problem} (through a view of it over {', '.join(view.tops())})"
    return TenantsPython(PythonView(), problem)


def separation(settings: OperatorSettings, *, tokens_in_use: bool) -> Separation:
    """What ``workload_users`` means on this agent (``auto`` resolved)."""
    root = os.geteuid() == 0
    match settings.workload_users:
        case "auto":
            return "tenant" if root and tokens_in_use else "agent"
        case "tenant":
            if not root:
                raise InputError(
                    "runs workloads as tenants' own users, which needs an agent running as root",
                    field="workload_users",
                    fix="run the agent as root, or set workload_users: agent",
                )
            return "tenant"
        case "agent":
            return "agent"


class Sandbox:
    def __init__(
        self,
        mode: Separation,
        settings: OperatorSettings,
        store: Store,
        data_dir: Path,
        homes: Path,
    ) -> None:
        self.mode = mode
        self.settings = settings
        self.store = store
        self.homes = homes
        self.python = TenantsPython(PythonView(), None)
        if mode == "tenant":
            os.chmod(data_dir, 0o700)  # tokens, store, runs and logs: the agent's alone
            homes.mkdir(mode=0o711, exist_ok=True)
            os.chmod(homes, 0o711)  # each tenant enters its own, and lists none
            # checked as the range's last uid: one no account uses (tenant_uids' rule)
            self.python = tenants_python(sys.executable, settings.tenant_uids[1])

    def identity(self, tenant: str, user: str | None) -> Identity:
        """Who a workload of ``tenant`` that asks for ``user`` runs as (``user`` was checked
        against the tenant's allowlist when it was applied)."""
        if self.mode == "agent":
            return Identity(user, None, {}, None)
        if user is not None:
            return Identity(user, None, {}, None, self.python.view)
        first, last = self.settings.tenant_uids
        uid = self.store.tenant_uid(tenant, first, last)
        home = self.homes / tenant
        home.mkdir(mode=0o700, exist_ok=True)
        os.chown(home, uid, uid)
        os.chmod(home, 0o700)
        return Identity(uid, uid, {"HOME": str(home)}, str(home), self.python.view)
