"""The OpenAPI 3.1 description of ``/v1``, served at ``GET /v1/openapi.json`` (no token needed),
generated from the API's operation table (:class:`z9.api.resources.Operation`) and the pydantic
models of its request and response bodies: what is validated and served is what is documented.
"""
from __future__ import annotations

from typing import Any, Iterable

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from . import schemas
from .resources import Operation

_REF = "#/components/schemas/{model}"
_IDEMPOTENCY = {"name": "Idempotency-Key", "in": "header", "required": False,
                "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                "description": "retrying with the same key and request replays the first answer"}
_TAGS = {"jobs": "Jobs: every change is done by a job; poll it (or long-poll with `wait_s`) until it is "
                 "succeeded or failed.",
         "tokens": "API tokens of the caller's tenant: `read` and/or `write` scopes; a secret is shown once."}
_STATUS_TEXT = {200: "OK", 201: "Created", 202: "Accepted: poll the job until it is terminal",
                400: "Malformed request (not JSON, an unknown query parameter)",
                403: "The token lacks the scope this needs",
                401: "Missing, unknown or revoked token", 404: "No such resource (or another tenant's)",
                409: "A precondition failed; the message names it", 422: "Invalid fields; the message names each",
                503: "A setting the operation needs is missing; the message names it"}


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    schema = model.model_json_schema()
    out = []
    for name, prop in schema.get("properties", {}).items():
        prop = dict(prop)
        desc = prop.pop("description", None)
        prop.pop("title", None)
        prop.pop("default", None) if prop.get("default") is None else None
        if "anyOf" in prop:  # `str | None`: a query parameter is absent rather than null
            kinds_ = [p for p in prop.pop("anyOf") if p.get("type") != "null"]
            prop.update(kinds_[0] if len(kinds_) == 1 else {"anyOf": kinds_})
        param = {"name": name, "in": "query", "required": name in schema.get("required", []), "schema": prop}
        if desc:
            param["description"] = desc
        out.append(param)
    return out


def openapi_document(operations: Iterable[Operation], *, tag_descriptions: dict[str, str] | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations`` (a fresh dict on every call)."""
    operations = list(operations)
    models: dict[type[BaseModel], str] = {schemas.Error: "serialization"}
    for op in operations:
        if op.request is not None:
            models[op.request] = "validation"
        for m in op.responses.values():
            if m is not None:
                models.setdefault(m, "serialization")
    refs, defs = models_json_schema([(m, mode) for m, mode in models.items()], ref_template=_REF)
    paths: dict[str, dict[str, Any]] = {}
    tags: dict[str, str] = {}
    for op in operations:
        tags.setdefault(op.tag, (tag_descriptions or {}).get(op.tag) or _TAGS.get(op.tag) or op.tag.capitalize())
        params: list[dict[str, Any]] = []
        if op.path_id:
            params.append({"name": "id", "in": "path", "required": True, "schema": {"type": "string"},
                           "description": op.path_id})
        if op.idempotent:
            params.append(_IDEMPOTENCY)
        if op.query is not None:
            params += _query_parameters(op.query)
        responses: dict[str, Any] = {}
        for status, model in sorted(op.responses.items()):
            if model is None:
                responses[str(status)] = {"$ref": "#/components/responses/Error"}
                continue
            content: dict[str, Any] = {"schema": refs[(model, models[model])]}
            if op.example is not None:
                content["example"] = op.example
            responses[str(status)] = {"description": _STATUS_TEXT.get(status, "OK"),
                                      "content": {"application/json": content}}
        entry: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary, "tags": [op.tag],
                                 "parameters": params, "responses": responses}
        if op.description:
            entry["description"] = op.description
        if op.request is not None:
            body: dict[str, Any] = {"schema": refs[(op.request, "validation")]}
            examples = (op.request.model_config.get("json_schema_extra") or {}).get("examples")
            if examples:
                body["example"] = examples[0]
            entry["requestBody"] = {"required": True, "content": {"application/json": body}}
        paths.setdefault(op.path, {})[op.method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {"title": "z9 API", "version": "1",
                 "description": "Every mutation answers 202 with the resource and a job; poll "
                                "GET /v1/jobs/{id} until it is succeeded or failed."},
        "servers": [{"url": "/v1"}],
        "security": [{"bearer": []}],
        "tags": [{"name": t, "description": d} for t, d in tags.items()],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "responses": {"Error": {"description": "An error; the message names the field or precondition",
                                    "content": {"application/json": {"schema": {"$ref": _REF.format(model="Error")}}}}},
            "schemas": defs.get("$defs", {}),
        },
    }
