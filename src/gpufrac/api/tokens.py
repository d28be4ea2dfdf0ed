"""API tokens: who is calling. A token file maps each token to a tenant, or to the admin.

```yaml
tokens:
  s3cr3t-search: {tenant: search}
  s3cr3t-ops: {admin: true}
```

With tokens configured, a request's tenant is its token's: it sees and changes only that tenant's
workloads, and a manifest naming another tenant is refused. Without tokens the agent listens on
loopback only, and every caller is the admin.
"""

from __future__ import annotations

from pathlib import Path

from gpufrac.errors import InputError
from gpufrac.model.caller import ADMIN, Caller
from gpufrac.model.manifest_fields import (
    load_documents,
    read_bool,
    read_dns_label,
    read_mapping,
    read_text_file,
)

__all__ = ["ADMIN", "Caller", "authenticate", "load_tokens", "parse_tokens"]


def authenticate(tokens: dict[str, Caller] | None, authorization: str) -> Caller | None:
    """Who sends ``Authorization: <authorization>``: without tokens configured, the admin; else the
    token's caller, or None for a missing or unknown token."""
    if tokens is None:
        return ADMIN
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":  # an auth scheme's name is case-insensitive (RFC 9110 11.1)
        return None
    return tokens.get(token.strip())


def parse_tokens(text: str, *, source: str = "tokens.yaml") -> dict[str, Caller]:
    docs = [d for d in load_documents(text, source=source) if d is not None]
    if len(docs) != 1:
        raise InputError(
            "must hold one document", field=source, fix="write tokens: {TOKEN: {tenant: NAME}}"
        )
    root = read_mapping(docs[0], "", ("tokens",), what="a mapping with tokens")
    raw = root.get("tokens", {})
    if not isinstance(raw, dict):
        raise InputError(
            "must be a mapping of token to {tenant: NAME} or {admin: true}", field="tokens"
        )
    out: dict[str, Caller] = {}
    for token, entry in raw.items():
        where = f"tokens.{token}"
        if not isinstance(token, str) or len(token) < 16:
            raise InputError(
                "tokens must be strings of at least 16 characters",
                field=where,
                fix="use a long random string",
            )
        body = read_mapping(
            entry, where, ("tenant", "admin"), what="{tenant: NAME} or {admin: true}"
        )
        if body.get("admin") is not None and read_bool(body["admin"], f"{where}.admin"):
            out[token] = ADMIN
        elif "tenant" in body:
            out[token] = Caller(read_dns_label(body["tenant"], f"{where}.tenant"))
        else:
            raise InputError(
                "names neither a tenant nor admin",
                field=where,
                fix="write {tenant: NAME} or {admin: true}",
            )
    return out


def load_tokens(path: Path) -> dict[str, Caller] | None:
    """The tokens in ``path``, or None when the file does not exist. A file that its group or
    other users may read (or write) is refused, saying the ``chmod`` that fixes it: anyone on the
    machine (a tenant's workload) could read the admin's token in it."""
    if not path.exists():
        return None
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise InputError(
            f"{path} is open to other users (mode {mode:04o}): they could read its API tokens",
            field=str(path),
            fix=f"chmod 600 {path}",
        )
    text = read_text_file(path, field=str(path))
    return parse_tokens(text, source=str(path))
