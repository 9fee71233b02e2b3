"""Completion webhooks: when a job is terminal, its record is POSTed, signed, to its callback URL.

The job's terminal write inserted a delivery row in the same transaction (comfysup.queue), so a webhook is
never lost and never holds up or fails a job: a :class:`Deliverer` (in the supervisor's monitor process,
and in ``comfysup work``'s parent) takes due rows, POSTs, and records each try; a failed try is retried
after ``random(0, min(max, base × 2^(n-1)))`` until ``[webhooks] attempts`` is spent, then given up. Every
try is visible in ``comfysup show`` and in metrics. Delivery is at least once: a receiver that must act
once per job keys on the job id (or ``X-Comfysup-Delivery``).

Signature (README, "Webhooks"): ``X-Comfysup-Timestamp: <unix seconds>`` and
``X-Comfysup-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" with [webhooks] secret>``. The
timestamp is signed with the body so a captured request cannot be replayed later with a new timestamp.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from comfysup import assets
from comfysup.backoff import RetryPolicy
from comfysup.config import WebhooksConfig
from comfysup.errors import NotFound, QueueError
from comfysup.queue.base import TERMINAL, Delivery, JobRecord, Queue
from comfysup.redact import Redactor, bound, display_url, mask
from comfysup.storage.links import no_links

if TYPE_CHECKING:
    import requests

log = logging.getLogger("comfysup.observability.webhooks")

TIMESTAMP_HEADER = "X-Comfysup-Timestamp"
SIGNATURE_HEADER = "X-Comfysup-Signature"
DELIVERY_HEADER = "X-Comfysup-Delivery"
BATCH = 20
HOLD_MARGIN_SECONDS = 30.0
"""A taken delivery is held this much longer than one POST can take: a deliverer that dies mid-send leaves
it due again after that, and a live one is never overtaken by another."""


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>`` of HMAC-SHA256 over ``timestamp + "." + body``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify(secret: str, timestamp: str, body: bytes, signature: str, *, now: float | None = None,
           tolerance_seconds: float = 300.0) -> bool:
    """What a receiver does: the signature matches (compared in constant time) and the timestamp is recent."""
    try:
        age = abs((time.time() if now is None else now) - int(timestamp))
    except ValueError:
        return False
    return age <= tolerance_seconds and hmac.compare_digest(sign(secret, timestamp, body), signature)


def record_body(job: JobRecord, links: Callable[[str], dict[str, Any]] = no_links) -> dict[str, Any]:
    """The job's record as POSTed: id, status, files with hashes, reason, timings — secrets masked. A file in a
    bucket has its ``location`` (s3://) and a presigned ``url`` with ``url_expires_at`` (``links``),
    made when the record is sent."""
    clean = Redactor.for_job(job.workflow, job.extra_data)
    started = min((a.started_at for a in job.attempts), default=None)
    return clean.scrub({
        "id": job.id,
        "status": job.state,
        "reason": clean(job.reason) if job.reason else None,
        "workflow_name": job.workflow_name,
        "params": mask(job.params),
        "inputs": assets.listing(job.params),
        "meta": mask(job.meta),
        "attempts": job.attempt,
        "machine": job.machine,
        "files": [{"name": o.name, "size": o.size, "sha256": o.sha256, "path": o.path, "node_id": o.node_id,
                   **links(o.path)} for o in job.outputs],
        "timings": {
            "submitted_at": job.submitted_at,
            "started_at": started,
            "finished_at": job.finished_at,
            "queue_wait_seconds": None if started is None else round(started - job.submitted_at, 3),
            "run_seconds": None if started is None or job.finished_at is None
            else round(job.finished_at - started, 3),
        },
    })  # by value too: a secret in a file name or a set value's key (webhooks and broker messages alike)


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class Deliverer:
    """Sends due deliveries of one queue; ``run_once`` is one pass, ``loop`` runs passes until stopped."""

    def __init__(self, queue: Queue, settings: WebhooksConfig, *, session: requests.Session | None = None,
                 rand: Callable[[], float] = random.random,
                 on_result: Callable[[str], None] = lambda result: None,
                 links: Callable[[str], dict[str, Any]] = no_links) -> None:
        self.queue = queue
        self.links = links
        """Presigned URLs of outputs in a bucket (comfysup.storage.links), made as each record is sent."""
        self.settings = settings
        self._session = session
        self.policy = RetryPolicy(attempts=settings.attempts, base_delay_seconds=settings.base_delay_seconds,
                                  max_delay_seconds=settings.max_delay_seconds, jitter=True)
        self.rand = rand
        self.on_result = on_result
        """Called with delivered, retry or failed after each try (metrics count them)."""
        self.counts: Counter[str] = Counter()
        if settings.url and not settings.secret:
            log.warning("webhooks: [webhooks] secret is empty, so deliveries are sent unsigned")

    @property
    def session(self) -> requests.Session:
        """Made at the first delivery: requests (and safehttp's checked connections) are loaded only by a
        process that sends one, not by every `comfysup work` and its forked runners (about 4 MB each)."""
        if self._session is None:
            import requests

            from comfysup.safehttp import public_only_session

            self._session = requests.Session() if self.settings.allow_private else public_only_session()
        return self._session

    def run_once(self, now: float | None = None) -> int:
        """Send every due delivery (in batches); returns how many tries were made."""
        tries = 0
        hold = self.settings.timeout_seconds + HOLD_MARGIN_SECONDS
        while True:
            due = self.queue.deliveries.claim_deliveries(BATCH, hold, now=now)
            for delivery in due:
                self._try(delivery)
                tries += 1
            if len(due) < BATCH:
                return tries

    def loop(self, stop: threading.Event, interval_seconds: float = 1.0) -> None:
        """Until ``stop`` is set; a queue that does not answer is retried at the next pass, never fatal."""
        while not stop.is_set():
            try:
                self.run_once()
            except QueueError as exc:
                log.warning("webhooks: the queue does not answer (%s); deliveries wait", exc)
            stop.wait(interval_seconds)

    def _try(self, delivery: Delivery) -> None:
        try:
            job = self.queue.reads.get(delivery.job_id)
        except NotFound:
            self._record(delivery, "failed", None, "the job is no longer in the queue")
            return
        if job.state not in TERMINAL:
            self._record(delivery, "failed", None, f"the job was requeued ({job.state}) before its webhook was "
                         "sent; its next end sends a new one")
            return
        body = encode(record_body(job, self.links))
        timestamp = str(int(time.time()))
        headers = {"Content-Type": "application/json", "User-Agent": "comfysup-webhook",
                   TIMESTAMP_HEADER: timestamp, DELIVERY_HEADER: str(delivery.id)}
        if self.settings.secret:
            headers[SIGNATURE_HEADER] = sign(self.settings.secret, timestamp, body)
        # Loaded by the first delivery only, as ``session`` says: forked runners never hold requests.
        import requests

        from comfysup.safehttp import PrivateDestination

        status: int | None = None
        try:
            answer = self.session.post(delivery.url, data=body, headers=headers,
                                       timeout=self.settings.timeout_seconds, allow_redirects=False)
            status = answer.status_code
            answer.close()
            error = None if 200 <= status < 300 else f"HTTP {status}"
        except PrivateDestination as exc:
            error = f"{exc} ([webhooks] allow_private = true allows it)"  # names the host, never the URL's path
        except requests.Timeout:
            error = f"no answer within {self.settings.timeout_seconds:g} s"
        except requests.ConnectionError:
            error = "cannot connect"  # requests' own text names the URL's path, which may be its secret
        except requests.RequestException as exc:
            error = type(exc).__name__
        if error is None:
            self._record(delivery, "delivered", status, None)
            log.info("job %s: webhook delivered to %s (HTTP %d)", job.id, display_url(delivery.url), status,
                     extra={"event": "webhook_delivered", "job": job.id})
            return
        tried = delivery.attempts + 1
        if tried >= self.settings.attempts:
            self._record(delivery, "failed", status, error)
            log.warning("job %s: webhook to %s given up after %d tries: %s", job.id, display_url(delivery.url),
                        tried, error, extra={"event": "webhook_failed", "job": job.id})
        else:
            delay = self.policy.backoff(tried, self.rand)
            self._record(delivery, "retry", status, error, next_at=time.time() + delay)
            log.info("job %s: webhook to %s failed (%s); try %d in %.1f s", job.id, display_url(delivery.url),
                     error, tried + 1, delay, extra={"event": "webhook_retry", "job": job.id})

    def _record(self, delivery: Delivery, result: str, status: int | None, error: str | None,
                next_at: float | None = None) -> None:
        self.queue.deliveries.delivery_result(delivery.id, delivered=result == "delivered", status=status,
                                   error=bound(error, 300) if error else None, next_at=next_at)
        self.counts[result] += 1
        self.on_result(result)
