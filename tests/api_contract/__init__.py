"""The Comfy API v2 conformance suite: cases derived from the spec itself, run against comfysup's API
over fake_comfy of both ComfyUI versions.

``openapi.yaml`` is the Comfy API v2 contract as Comfy publishes it, copied unchanged (data, not code) from
``spec/openapi.yaml`` of comfy-api-proxy 0.1.6's source distribution on PyPI (``info.version`` 2.0.0; its pin,
``openapi.VERSION``, names the upstream commit 3af892297de49738e8e675788420afbce956ef04, synced 2026-07-16). A
newer spec is dropped in place of it: every operation, status and error code it lists becomes a case, and one that
comfysup cannot answer fails until it is built or written down in docs/api.md's difference table.
"""
