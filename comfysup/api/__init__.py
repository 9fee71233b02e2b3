"""The Comfy API v2 in front of the queue: ``/api/v2/jobs`` and ``/api/v2/health`` served by aiohttp.

A front door (DESIGN.md "The shape"): a thin translation of the contract into the same submit as ``comfysup
submit`` — the same validation (comfysup.jobs, node catalogues included), the same transaction, the same
idempotency by job id (``Idempotency-Key`` → the job id) — and of the queue's records back into the contract's
job objects. The contract is Comfy's own, read from its sources:

- ``Comfy-Org/comfy-api-proxy`` ``spec/openapi.yaml@37fbee21df60dd598638786cbdcc6c1e1beada7c`` (paths, status
  names, the error envelope and its codes, Stripe semantics of ``Idempotency-Key``);
- the ``comfy-sdk`` 0.5.0 package: ``comfy_low/models/_generated.py`` (the models every body is validated
  against in the tests) and ``comfy_low/transport.py`` (``list_jobs``: ``metadata[<key>]=<value>``, ``limit``,
  ``cursor``; ``{"jobs": [...], "next_cursor"}``).

Modules: ``security`` (token, loopback, origin), ``errors`` (the envelope), ``views`` (records → bodies, pure),
``intake`` (a request body → a NewJob through comfysup.jobs), ``app`` (the routes), ``remote`` (outputs streamed from
the machine that holds them), ``serve`` (the process).
"""
