"""The Comfy API v2 in front of the queue: ``/api/v2/jobs`` and ``/api/v2/health`` served by aiohttp.

A front door (docs/design.md "The shape"): a thin translation of the contract into the same submit as ``comfysup
submit`` — the same validation (comfysup.jobs, node catalogues included), the same transaction, the same
idempotency by job id (``Idempotency-Key`` → the job id) — and of the queue's records back into the contract's
job objects. The contract is Comfy's own, read from its sources:

- ``Comfy-Org/comfy-api-proxy`` ``spec/openapi.yaml`` (``info.version`` 2.0.0; a copy is
  tests/api_contract/openapi.yaml, whose cases the conformance suite derives from it): paths, status names, the
  error envelope and its codes, single-use ``Idempotency-Key``;
- the ``comfy-sdk`` 0.5.0 package: ``comfy_low/models/_generated.py`` (the models every body is validated
  against in the tests) and ``comfy_low/transport.py`` (``list_jobs``: ``metadata[<key>]=<value>``, ``limit``,
  ``cursor``; ``{"jobs": [...], "next_cursor"}``).

Modules: ``security`` (token, loopback, origin), ``errors`` (the envelope), ``views`` (records → bodies, pure),
``intake`` (a request body → a NewJob through comfysup.jobs), ``app`` (the guard and the routing table),
``state`` (what the handlers share), ``jobs`` (the job routes), ``assets`` (uploads), ``references`` (a
workflow's ``core/ASSET`` references), ``placement`` (files of this machine: from-path, model files), ``remote``
(outputs streamed from the machine that holds them), ``serve`` (the process).
"""
