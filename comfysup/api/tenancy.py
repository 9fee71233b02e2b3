"""Which tenant a request acts as, and what it may see.

The admin token (``[api] token``) sees every job; a tenant's token (the token whose SHA-256 is its
``[tenants.NAME] token_sha256``) acts as that tenant: its jobs are submitted as that tenant's, and it lists,
reads, cancels and streams only that tenant's jobs and their outputs, and the uploads it made. Another tenant's
id answers 404 as an unknown one does, never 403, so ids cannot be probed. Any other token is 401.

Tokens are compared by their digests: the given token's SHA-256 looked up among the tenants', the admin token
with ``hmac.compare_digest`` (comfysup.api.security). Neither is ever logged.
"""

from __future__ import annotations

import hashlib
from typing import Any

from aiohttp import web

from comfysup.api.errors import ApiError, not_found
from comfysup.api.security import check_token
from comfysup.config import Config

TENANT_KEY = web.RequestKey("tenant", str)
"""The tenant a request acts as; empty: the admin (or no token configured), who sees every tenant."""


class Tenancy:
    """The tenants' token digests, by digest (from the config's ``[tenants.NAME]``)."""

    def __init__(self, config: Config) -> None:
        self.admin_token = config.api.token
        self.by_digest = {t.token_sha256.lower(): t.name for t in config.tenants if t.token_sha256}

    def caller(self, header: str | None) -> str:
        """The tenant ``header`` (``Bearer <token>``) names, "" for the admin token (or when the API asks none
        and no tenant's token is given); raises 401 for any other token."""
        given = header[7:].strip() if header and header[:7].lower() == "bearer " else ""
        if given and self.by_digest:
            tenant = self.by_digest.get(hashlib.sha256(given.encode()).hexdigest())
            if tenant is not None:
                return tenant
        check_token(self.admin_token, header)
        return ""


def tenant(request: web.Request) -> str:
    """The tenant the request acts as; "" for the admin."""
    return request.get(TENANT_KEY, "")


def sees(who: str, record: Any) -> bool:
    """Whether the caller ``who`` (a tenant, "" for the admin) may see the job ``record``."""
    return not who or record.tenant == who


def owned(who: str, record: Any, what: str = "job") -> Any:
    """``record`` when ``who`` may see it; else 404 ``what`` not found, as for an unknown id."""
    if not sees(who, record):
        raise not_found(what)
    return record


def full(exc: Any, retry_seconds: int) -> ApiError:
    """429 for a submit past the tenant's ``max_queued`` (comfysup.queue.tenants.TenantFull)."""
    return ApiError(429, "queue_full", f"tenant {exc.tenant!r} holds {exc.max_queued} or more queued jobs "
                    f"([tenants.{exc.tenant}] max_queued); retry later",
                    headers={"Retry-After": str(retry_seconds)}, details={"queued": exc.queued})


def upload_key(key: str | None, who: str) -> str | None:
    """An upload's Idempotency-Key as the queue keeps it: kept apart per tenant, as a job's is."""
    return f"{who}\0{key}" if who and key is not None else key
