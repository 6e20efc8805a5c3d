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
                "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
                "description": "retrying with the same key and request replays the first answer"}
_TAGS = {"jobs": "Jobs: every change is done by a job; poll it (or long-poll with `wait_s`) until it is "
                 "succeeded or failed.",
         "tokens": "API tokens of the caller's tenant: `read` and/or `write` scopes; a secret is shown once.",
         "regions": "What can be asked for: the regions, their images and address pools.",
         "operator": "The platform's views (a token with the operator scope): every tenant's jobs, the regions' caps "
                     "and load, the deletion guard's refusals."}
_STATUS_TEXT = {200: "OK", 201: "Created", 202: "Accepted: poll the job until it is terminal",
                400: "Malformed request (not JSON, an unknown query parameter)",
                403: "The token lacks the scope this needs, or a quota would be exceeded (`quota_exceeded`)",
                401: "Missing, unknown or revoked token", 404: "No such resource (or another tenant's)",
                409: "A precondition failed; the message names it",
                422: "Invalid fields, or fields naming what does not exist (a region, image or pool of this "
                     "installation, another resource of the tenant), or an Idempotency-Key already used with "
                     "another request; the message names each",
                413: "The request body is larger than 256 KiB",
                429: "Over the token's request rate; retry after Retry-After seconds",
                503: "The database is unreachable right now (retry after Retry-After seconds), or a setting the operation needs is missing (the message names it)"}


def _refusals(op: Operation) -> set[int]:
    """What an operation may answer before its own checks, from the app's middleware: an invalid
    Idempotency-Key (400) or one already used with another request (422), a read-only token on a
    mutation (403), an invalid value of a declared query parameter (422), a body over the limit (413), the rate limit (429), the database unreachable
    (503) — for authenticated operations."""
    if 401 not in op.responses:
        return set()
    out = {429, 503}
    if op.idempotent:
        out |= {400, 422}
    if op.query is not None:  # a declared query parameter's value is validated (a NUL in it: 422)
        out.add(422)
    if op.method.upper() not in ("GET", "HEAD"):
        out.add(403)
    if op.request is not None:
        out.add(413)
    return out


_EVERY = (400, 401, 403, 429)
_HEADERS = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"},
            "RateLimit": {"$ref": "#/components/headers/RateLimit"},
            "RateLimit-Policy": {"$ref": "#/components/headers/RateLimit-Policy"}}


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
        if prop.get("type") == "string" and "pattern" not in prop and "enum" not in prop:
            # the API answers 422 for a NUL in any query value (middleware.py): say so
            prop["pattern"] = "^[^\\u0000]*$"
        param = {"name": name, "in": "query", "required": name in schema.get("required", []), "schema": prop}
        if desc:
            param["description"] = desc
        out.append(param)
    return out


def _add_links(operations: list[Operation], paths: dict[str, dict[str, Any]]) -> None:
    """OpenAPI links from each answer that carries a resource or a job (201, 202) to the operations
    on it: ``$response.body#/<name>/id`` into every operation on ``/<plural>/{id}…`` of the
    answer's own collection, ``$response.body#/job/id`` into the job's. Clients (and the stateful
    phase of tests/integration/api/test_schemathesis.py) follow them: create, act, follow the job, delete."""
    by_collection: dict[str, list[Operation]] = {}
    for op in operations:
        if op.path_id:
            by_collection.setdefault(op.path.split("/")[1], []).append(op)
    for op in operations:
        for status in (201, 202):
            model = op.responses.get(status)
            if model is None:
                continue
            links: dict[str, Any] = {}
            for name, field in model.model_fields.items():  # the resource (named for its type) and its job
                kind = field.annotation
                if not (isinstance(kind, type) and issubclass(kind, BaseModel) and "id" in kind.model_fields):
                    continue
                for target in by_collection.get("jobs" if name == "job" else op.path.split("/")[1], []):
                    if target is op or target.deprecated:  # links lead to the current paths only
                        continue
                    links[target.operation_id] = {"operationId": target.operation_id,
                                                  "parameters": {"id": f"$response.body#/{name}/id"}}
            if links:
                paths[op.path][op.method.lower()]["responses"][str(status)]["links"] = links


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
        # What every authenticated operation may answer besides its own statuses: a malformed
        # request or unknown query parameter (400), no valid token (401), a missing scope (403),
        # the rate limit (429), the database unreachable (503), the middleware's own refusals
        # (_refusals); an operation on an id: 404.
        every = (set(_EVERY) | _refusals(op)) if 401 in op.responses else set()
        answers = {**dict.fromkeys(every), **({404: None} if op.path_id else {}), **op.responses}
        for status, model in sorted(answers.items()):
            if model is None:
                responses[str(status)] = {"$ref": "#/components/responses/" + ("RateLimited" if status == 429 else "Error")}
                continue
            content: dict[str, Any] = {"schema": refs[(model, models[model])]}
            if op.example is not None:
                content["example"] = op.example
                if isinstance(op.example, dict) and "jobs" in model.model_fields and "jobs" not in op.example:
                    content["example"] = {**op.example, "jobs": [op.example["job"]]}  # one job: jobs is [job]
            headers = dict(_HEADERS)
            if status == 202:
                headers["Location"] = {"$ref": "#/components/headers/Location"}
            responses[str(status)] = {"description": _STATUS_TEXT.get(status, "OK"), "headers": headers,
                                      "content": {"application/json": content}}
        entry: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary, "tags": [op.tag],
                                 "parameters": params, "responses": responses}
        if op.description:
            entry["description"] = op.description
        if op.deprecated:
            entry["deprecated"] = True
        if op.request is not None:
            body: dict[str, Any] = {"schema": refs[(op.request, "validation")]}
            examples = (op.request.model_config.get("json_schema_extra") or {}).get("examples")
            if examples:
                body["example"] = examples[0]
            entry["requestBody"] = {"required": True, "content": {"application/json": body}}
        paths.setdefault(op.path, {})[op.method.lower()] = entry
    _add_links(operations, paths)
    return {
        "openapi": "3.1.0",
        "info": {"title": "z9 API", "version": "1",
                 "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
                 "description": "Every mutation answers 202 with the resource and a job; poll "
                                "GET /v1/jobs/{id} until it is succeeded or failed."},
        "servers": [{"url": "/v1"}],
        "security": [{"bearer": []}],
        "tags": [{"name": t, "description": d} for t, d in tags.items()],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "responses": {
                "Error": {"description": "An error; the message names the field or precondition",
                          "headers": dict(_HEADERS),
                          "content": {"application/json": {"schema": {"$ref": _REF.format(model="Error")}}}},
                "RateLimited": {"description": "Rate limited: retry after `Retry-After` seconds",
                                "headers": {**_HEADERS, "Retry-After": {"$ref": "#/components/headers/Retry-After"}},
                                "content": {"application/json": {"schema": {"$ref": _REF.format(model="Error")}}}},
            },
            "headers": {
                "X-Request-Id": {"description": "the request's id (the client's own when it sent a valid one); "
                                                "in every log line and in the jobs the request made",
                                 "schema": {"type": "string"}},
                "RateLimit": {"description": "the caller's rate limit state: `\"token\";r=<remaining>;t=<seconds "
                                             "until full>` (IETF httpapi ratelimit-headers)",
                              "schema": {"type": "string"}},
                "RateLimit-Policy": {"description": "`\"token\";q=<burst>;w=<seconds to refill>`",
                                     "schema": {"type": "string"}},
                "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}},
                "Location": {"description": "the job to follow (`/v1/jobs/{id}`)", "schema": {"type": "string"}},
            },
            "schemas": defs.get("$defs", {}),
        },
    }
