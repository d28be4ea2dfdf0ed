"""Who calls the API: a tenant (who sees only its own workloads) or the admin (who sees every one).
The API reads it from the request's token (``api.tokens``); the views of every layer are rendered
for it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str | None  # None: the admin
    admin: bool = False

    def may_see(self, tenant: str) -> bool:
        return self.admin or self.tenant == tenant


ADMIN = Caller(None, admin=True)
