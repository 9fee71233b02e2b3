"""The spec as data: its operations, the statuses each answers, the error codes each status names, and a check of a
body against one of its schemas (the subset of OpenAPI 3.0 the spec uses: type, required, properties, nullable,
enum, items, allOf, $ref, additionalProperties, the uri and date-time formats)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

SPEC_PATH = Path(__file__).with_name("openapi.yaml")
CODE = re.compile(r"`([a-z_]+)`")
ENVELOPE_CODE = re.compile(r"`([a-z_]+)`\s*\((\d{3})")
METHODS = ("get", "head", "post", "put", "patch", "delete")


@cache
def spec() -> dict[str, Any]:
    return yaml.safe_load(SPEC_PATH.read_text())


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` (``#/components/...``) followed, as often as it takes."""
    while "$ref" in node:
        target: Any = spec()
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


@dataclass(frozen=True)
class Answer:
    """One status of one operation as the spec lists it; ``code``: one error code its description names."""

    operation: str
    method: str
    path: str
    status: int
    code: str | None
    schema: dict[str, Any] | None

    @property
    def id(self) -> str:
        return f"{self.operation}-{self.status}" + (f"-{self.code}" if self.code else "")


def operations() -> list[tuple[str, str, str, dict[str, Any]]]:
    """``(operationId, method, path, operation)`` of every operation, in the spec's order."""
    found = []
    for path, item in spec()["paths"].items():
        for method in METHODS:
            if method in item:
                found.append((item[method]["operationId"], method.upper(), path, item[method]))
    return found


def answers() -> list[Answer]:
    """Every (operation, status) and, for an error status, every code its description names in backquotes."""
    found = []
    for operation, method, path, op in operations():
        for status, response in op["responses"].items():
            response = resolve(response)
            media = response.get("content", {}).get("application/json", {})
            schema = resolve(media["schema"]) if "schema" in media else None
            is_error = schema is not None and schema is resolve({"$ref": "#/components/schemas/ErrorEnvelope"})
            codes = CODE.findall(response.get("description", "")) if is_error else []
            for code in codes or [None]:
                found.append(Answer(operation, method, path, int(status), code, schema))
    return found


def envelope_codes() -> dict[str, int]:
    """``ErrorEnvelope``'s list of core codes with their statuses (``invalid_workflow (422)``, ...)."""
    text = spec()["components"]["schemas"]["ErrorEnvelope"]["description"]
    return {code: int(status) for code, status in ENVELOPE_CODE.findall(text)}


def reserved_job_fields() -> list[str]:
    """The fields postJobs says are "reserved ... and rejected if present today"."""
    text = dict((o, op) for o, _m, _p, op in operations())["postJobs"]["description"]
    sentence = text[text.index("Reserved"):]
    return CODE.findall(sentence.split(".")[0])


def request_schema(operation: str) -> dict[str, Any]:
    op = dict((o, op) for o, _m, _p, op in operations())[operation]
    content = op["requestBody"]["content"]
    return resolve(next(iter(content.values()))["schema"])


TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,), "integer": (int,),
                                      "number": (int, float), "boolean": (bool,)}


def problems(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """Where ``value`` breaks ``schema``; empty when it conforms."""
    schema = resolve(schema)
    if value is None:
        return [] if schema.get("nullable") else [f"{where} is null"]
    found: list[str] = []
    for part in schema.get("allOf", []):
        found += problems(value, part, where)
    kind = schema.get("type")
    if kind is not None and (not isinstance(value, TYPES[kind]) or
                             (kind in ("integer", "number") and isinstance(value, bool))):
        return [*found, f"{where} is {type(value).__name__}, not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{where} is {value!r}, not one of {schema['enum']}")
    if kind == "string":
        found += _format(value, schema.get("format"), where)
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                found.append(f"{where}.{name} is missing")
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                found += problems(item, properties[name], f"{where}.{name}")
            elif extra is False:
                found.append(f"{where}.{name} is not in the schema")
            elif isinstance(extra, dict):
                found += problems(item, extra, f"{where}.{name}")
    if isinstance(value, list) and "items" in schema:
        for n, item in enumerate(value):
            found += problems(item, schema["items"], f"{where}[{n}]")
    return found


def _format(value: str, fmt: str | None, where: str) -> list[str]:
    if fmt == "date-time":
        try:
            datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return [f"{where} {value!r} is not a date-time"]
    if fmt == "uri":
        parts = urlsplit(value)
        if not (parts.scheme and parts.netloc):
            return [f"{where} {value!r} is not an absolute URI"]
    return []
