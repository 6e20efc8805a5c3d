"""The OpenAPI 3.1 description of ``/v1``, served at ``GET /v1/openapi.json`` (no token needed).

Request bodies come from the pydantic models in :mod:`z9.api.schemas`, so validation and
documentation cannot drift apart.
"""
from __future__ import annotations

from typing import Any

from .schemas import ServerCreate
from .tokens import Token, TokenCreate

_ERR = {"$ref": "#/components/responses/Error"}
_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
_IDEMPOTENCY = {"name": "Idempotency-Key", "in": "header", "schema": {"type": "string", "maxLength": 255},
                "description": "retrying with the same key and request replays the first answer"}
_PAGE = [
    {"name": "after", "in": "query", "schema": {"type": "string"}, "description": "id of the last item of the previous page"},
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 100}},
]


def _accepted(resource: str) -> dict[str, Any]:
    return {"description": "Accepted: poll the job until it is terminal",
            "content": {"application/json": {"schema": {
                "type": "object", "required": [resource, "job"],
                "properties": {resource: {"$ref": "#/components/schemas/Server"},
                               "job": {"$ref": "#/components/schemas/JobRef"}}}}}}


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document (a fresh dict on every call)."""
    ts = {"type": ["string", "null"], "format": "date-time"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "z9 API", "version": "1",
                 "description": "Every mutation answers 202 with the resource and a job; poll "
                                "GET /v1/jobs/{id} until it is succeeded or failed."},
        "servers": [{"url": "/v1"}],
        "security": [{"bearer": []}],
        "paths": {
            "/servers": {
                "post": {"summary": "Create a server", "operationId": "createServer",
                         "parameters": [_IDEMPOTENCY],
                         "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ServerCreate"}}}},
                         "responses": {"202": _accepted("server"), "400": _ERR, "401": _ERR, "409": _ERR, "422": _ERR}},
                "get": {"summary": "List servers", "operationId": "listServers",
                        "parameters": _PAGE + [{"name": "status", "in": "query", "schema": {"$ref": "#/components/schemas/ServerStatus"}}],
                        "responses": {"200": {"description": "A page of servers", "content": {"application/json": {"schema": {
                            "type": "object", "properties": {"servers": {"type": "array", "items": {"$ref": "#/components/schemas/Server"}},
                                                             "next_after": {"type": ["string", "null"]}}}}}},
                                      "401": _ERR, "422": _ERR}},
            },
            "/servers/{id}": {
                "get": {"summary": "Get a server", "operationId": "getServer", "parameters": [_ID],
                        "responses": {"200": {"description": "The server", "content": {"application/json": {"schema": {
                            "type": "object", "properties": {"server": {"$ref": "#/components/schemas/Server"}}}}}},
                                      "401": _ERR, "404": _ERR}},
                "delete": {"summary": "Delete a server (two-phase: a buffer during which it can be cancelled)",
                           "operationId": "deleteServer", "parameters": [_ID],
                           "responses": {"202": _accepted("server"), "401": _ERR, "404": _ERR, "409": _ERR}},
            },
            "/servers/{id}/actions/cancel-deletion": {
                "post": {"summary": "Cancel a deletion within its buffer", "operationId": "cancelServerDeletion",
                         "parameters": [_ID, _IDEMPOTENCY],
                         "responses": {"202": _accepted("server"), "401": _ERR, "404": _ERR, "409": _ERR}},
            },
            "/jobs": {
                "get": {"summary": "List jobs", "operationId": "listJobs",
                        "parameters": _PAGE + [{"name": "resource_id", "in": "query", "schema": {"type": "string"}},
                                               {"name": "actor", "in": "query", "schema": {"type": "string"},
                                                "description": "only the jobs asked for by this token id (`me`: the calling token)"}],
                        "responses": {"200": {"description": "A page of jobs, oldest first", "content": {"application/json": {"schema": {
                            "type": "object", "properties": {"jobs": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}},
                                                             "next_after": {"type": ["string", "null"]}}}}}},
                                      "401": _ERR, "422": _ERR}},
            },
            "/jobs/{id}": {
                "get": {"summary": "Get a job: status, attempt, steps, error", "operationId": "getJob",
                        "parameters": [_ID, {"name": "wait_s", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": 60, "default": 0},
                                             "description": "long-poll: answer as soon as the job's status or steps change, or after this many seconds "
                                                            "with the job as it is (a terminal job answers at once)"}],
                        "responses": {"200": {"description": "The job (a job not yet terminal carries `Retry-After: 5`, the polling interval)",
                                              "headers": {"Retry-After": {"schema": {"type": "integer"}}}, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Job"}}}},
                                      "400": _ERR, "401": _ERR, "404": _ERR}},
            },
            "/tokens": {
                "post": {"summary": "Create an API token for this tenant (its secret is shown once)", "operationId": "createToken",
                         "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TokenCreate"}}}},
                         "responses": {"201": {"description": "The token and its secret", "content": {"application/json": {"schema": {
                             "type": "object", "required": ["token", "secret"],
                             "properties": {"token": {"$ref": "#/components/schemas/Token"}, "secret": {"type": "string"}}}}}},
                                       "400": _ERR, "401": _ERR, "403": _ERR, "422": _ERR}},
                "get": {"summary": "List this tenant's tokens (with their last use, coarse)", "operationId": "listTokens",
                        "parameters": _PAGE + [{"name": "include_revoked", "in": "query", "schema": {"type": "boolean", "default": False}}],
                        "responses": {"200": {"description": "A page of tokens", "content": {"application/json": {"schema": {
                            "type": "object", "properties": {"tokens": {"type": "array", "items": {"$ref": "#/components/schemas/Token"}},
                                                             "next_after": {"type": ["string", "null"]}}}}}},
                                      "401": _ERR, "422": _ERR}},
            },
            "/tokens/{id}": {
                "delete": {"summary": "Revoke a token", "operationId": "revokeToken", "parameters": [_ID],
                           "responses": {"200": {"description": "The revoked token", "content": {"application/json": {"schema": {
                               "type": "object", "properties": {"token": {"$ref": "#/components/schemas/Token"}}}}}},
                                         "401": _ERR, "403": _ERR, "404": _ERR}},
            },
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "responses": {"Error": {"description": "An error; the message names the field or precondition",
                                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}},
            "schemas": {
                "ServerCreate": ServerCreate.model_json_schema(),
                "TokenCreate": TokenCreate.model_json_schema(),
                "Token": Token.model_json_schema(),
                "ServerStatus": {"type": "string", "enum": ["creating", "running", "stopped", "deleting", "destroying", "deleted", "failed"]},
                "Server": {"type": "object", "properties": {
                    "id": {"type": "string"}, "name": {"type": "string"}, "region": {"type": "string"},
                    "image": {"type": "string"}, "cores": {"type": "integer"}, "memory_mib": {"type": "integer"},
                    "disk_gib": {"type": "integer"}, "ssh_keys": {"type": "array", "items": {"type": "string"}},
                    "status": {"$ref": "#/components/schemas/ServerStatus"},
                    "status_reason": {"type": ["string", "null"]},
                    "observed": {"type": "object", "properties": {
                        "vmid": {"type": ["integer", "null"]}, "node": {"type": ["string", "null"]},
                        "power_state": {"type": ["string", "null"], "enum": ["running", "stopped", None]}, "at": ts}},
                    "delete_after": ts, "created_at": ts, "updated_at": ts, "deleted_at": ts}},
                "JobStatus": {"type": "string", "enum": ["pending", "running", "retry", "succeeded", "failed"]},
                "JobRef": {"type": "object", "required": ["id", "kind", "status"], "properties": {
                    "id": {"type": "string"}, "kind": {"type": "string"}, "status": {"$ref": "#/components/schemas/JobStatus"}}},
                "Step": {"type": "object", "properties": {
                    "name": {"type": "string"}, "state": {"type": "string", "enum": ["pending", "running", "done", "failed", "skipped"]},
                    "started_at": ts, "finished_at": ts,
                    "detail": {"type": "object", "description": "e.g. the UPID being waited on, the vmid chosen"}}},
                "Job": {"type": "object", "properties": {
                    "id": {"type": "string"}, "kind": {"type": "string"}, "region": {"type": "string"},
                    "resource": {"type": ["object", "null"], "properties": {"type": {"type": "string"}, "id": {"type": "string"}}},
                    "status": {"$ref": "#/components/schemas/JobStatus"},
                    "attempt": {"type": "integer"}, "max_attempts": {"type": "integer"}, "run_after": ts,
                    "steps": {"type": "array", "items": {"$ref": "#/components/schemas/Step"}},
                    "error": {"type": ["object", "null"], "properties": {
                        "class": {"type": "string", "enum": ["temporary", "permanent", "snooze"]},
                        "message": {"type": "string"}, "at": ts,
                        "task_log": {"type": "array", "items": {"type": "string"}}}},
                    "created_at": ts, "started_at": ts, "finished_at": ts, "updated_at": ts,
                    "actor": {"type": ["string", "null"], "description": "the API token that asked for the job (null: z9 itself)"},
                    "request_id": {"type": ["string", "null"], "description": "the X-Request-Id of that request"}}},
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                    "type": "object", "required": ["code", "message"],
                    "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "details": {}}}}},
            },
        },
    }
