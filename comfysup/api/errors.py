"""The contract's error envelope: ``{"error": {"code", "message", "details"}}`` with its HTTP status; ``details``
is an object or null, always there (one shape for every error, as comfy-api-proxy answers).

Codes as ``ErrorEnvelope`` lists them (comfy-api-proxy ``spec/openapi.yaml`` 2.0.0, a copy in
tests/api_contract/openapi.yaml), each with the spec's status: ``invalid_workflow`` (422), ``workflow_format_ui``
(422), ``missing_asset`` (422), ``hash_mismatch`` (409), ``blob_not_found`` (404), ``idempotency_key_reuse`` (422),
``invalid_request`` (400), ``queue_full`` (429 + Retry-After), ``not_found`` (404), ``unauthorized`` (401),
``forbidden`` (403). comfysup adds codes only for what the spec does not name (docs/api.md lists them):
``metadata_invalid`` (422, comfy-sdk's), ``payload_too_large`` (413) and ``too_many_streams`` (429, both
comfy-api-proxy's), ``misdirected_request`` (421) for a Host that does not name this API (comfysup.api.security),
``request_timeout`` (408) for a body that stalls, ``range_not_satisfiable`` (416), ``method_not_allowed`` (405),
``bad_gateway`` (502, another machine's API), ``queue_unavailable``, ``storage_unavailable`` (no credentials to
presign an output in a bucket with, comfysup.api.outputs) and ``too_many_connections`` (503,
comfysup.api.connections).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from comfysup.errors import QueueUnavailable

QUEUE_RETRY_AFTER_SECONDS = 5
"""What a 503 ``queue_unavailable`` asks the client to wait before it tries again (``Retry-After``)."""


class ApiError(Exception):
    """An answer that is an error envelope; raised anywhere in a handler, rendered by the app's middleware."""

    def __init__(self, status: int, code: str, message: str, *, details: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers or {}
        self.close = close
        """Close the connection after the answer (the rest of a stalled or refused body is not read)."""

    def response(self) -> web.Response:
        body: dict[str, Any] = {"code": self.code, "message": self.message, "details": self.details}
        response = web.Response(status=self.status, text=json.dumps({"error": body}),
                                content_type="application/json", headers=self.headers)
        if self.close:
            response.force_close()
        return response


def not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", f"{what} not found")


def queue_unavailable(exc: QueueUnavailable, writes: bool) -> ApiError:
    """503 ``queue_unavailable`` for a queue database that does not answer now (restarted, unreachable, locked by a
    backup): said with Retry-After, and with whether a request that writes (``writes``) stored anything: nothing,
    unless the failure came as its commit was sent (then sending the same request again stores it once)."""
    if not writes:
        stored = ""
    elif exc.maybe_stored:
        stored = ("; the database stopped answering as the change was committed, so it may or may not have been "
                  "stored: send the same request again (a job's id stores it once)")
    else:
        stored = "; nothing was stored: send the request again once the queue answers"
    return ApiError(503, "queue_unavailable", f"the queue is unavailable: {exc}{stored}",
                    details={"retry_after_seconds": QUEUE_RETRY_AFTER_SECONDS},
                    headers={"Retry-After": str(QUEUE_RETRY_AFTER_SECONDS)})
