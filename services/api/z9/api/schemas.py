"""Request and response bodies of the REST API (pydantic v2). Requests reject unknown fields;
responses are built through their models (so what is served is what the OpenAPI document,
generated from these models, says). A resource type's own models live with its API registration
(``z9.resources.server.api``); the shapes every type shares are here.
"""
from __future__ import annotations


from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, WithJsonSchema, model_validator)

# shared with the client (pydantic only): re-exported here, where the API and its slices look for them
from .bodies import (LABEL_KEY, LABEL_VALUE, LabelKey, Labels, LabelValue,  # noqa: F401
                     NAME_PATTERN, PATTERN_WORDS, SSH_KEY_MAX, SSH_KEY_PATTERN, SSH_KEY_PREFIXES,  # noqa: F401
                     SSH_KEY_SPACE, ServerCreate, pattern_words)


def at_least_one(*fields: str) -> dict[str, Any]:
    """A body's JSON Schema rule "at least one of ``fields`` is given" (for a model whose fields
    are all optional, never null — :func:`left_out` and :func:`no_null` — and whose validator
    says so), to merge into its ``json_schema_extra``. ``minProperties`` rather than a top-level
    ``anyOf`` of branches beside ``properties``: code generators (openapi-python-client) turn such
    an ``anyOf`` into branch-only models with the fields untyped."""
    return {"minProperties": 1}


def left_out(schema: dict[str, Any]) -> None:
    """A field that may be left out (unchanged) but is never null: no ``default: null`` in the
    document (it would not validate against the field's own schema)."""
    schema.pop("default", None)


def no_null(v: Any) -> Any:
    """A ``mode="before"`` field validator's body: an explicit null is not a value (422 naming the
    field); leave the field out instead."""
    if v is None:
        raise ValueError("null is not a value; leave the field out")
    return v


Timestamp = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]
"""A time as the API writes it: ISO 8601 in UTC with a ``Z``."""
OptTimestamp = Annotated[str | None, WithJsonSchema({"type": ["string", "null"], "format": "date-time"})]

# Labels: defined in bodies.py (requests take them), re-exported here


class Response(BaseModel):
    """Base of response bodies: every field is listed as required in the document (a field that
    can be empty is ``null``, never absent)."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


# ---------------------------------------------------------------------------------- servers

ServerStatus = Literal["creating", "running", "stopped", "deleting", "destroying", "deleted", "failed"]


class ServerObserved(Response):
    """What the last job's verify saw of the server's VM."""

    vmid: int | None
    node: str | None
    power_state: Literal["running", "stopped"] | None
    at: OptTimestamp


class ServerPublicIpv4(Response):
    """A server's primary IPv4 address."""

    id: str = Field(pattern=r"^adr_[0-9a-z]{26}$")
    ip: str


class Server(Response):
    """A server (``GET /v1/servers/{id}``)."""

    id: str = Field(pattern=r"^srv_[0-9a-z]{26}$")
    name: str
    region: str
    image: str
    cores: int
    memory_mib: int
    disk_gib: int
    ssh_keys: list[str]
    labels: dict[str, str]
    status: ServerStatus
    status_reason: str | None = Field(description="why the server is failed — its create's error, e.g. cloud-init's "
                                                  "error in the guest or a guest that booted from another seed "
                                                  "(the VM stays, observed) — or what failed during its deletion")
    observed: ServerObserved
    public_ipv4: ServerPublicIpv4 | None = Field(description="its primary IPv4 address (GET /v1/addresses/{id})")
    delete_after: OptTimestamp = Field(description="while deleting: when the buffer ends")
    created_at: Timestamp
    updated_at: Timestamp
    deleted_at: OptTimestamp


# ---------------------------------------------------------------------------------- jobs

JobStatus = Literal["pending", "running", "retry", "succeeded", "failed"]


class JobRef(Response):
    """The ``job`` of a 202 answer: poll ``GET /v1/jobs/{id}`` until it is terminal."""

    id: str = Field(pattern=r"^job_[0-9a-z]{26}$")
    kind: str
    status: JobStatus


class Accepted(Response):
    """Base of every 202 answer (``<ServerAccepted>`` and the other types'): the resource as it
    is now, its ``job`` and ``jobs``: every job the request made, ``job`` first. A request that
    asks for more than one job's work — a server created with ``public_ipv4`` is a ServerCreate
    and an AddressAssign — is done (what was asked for is in place: the server reachable at its
    address) when every job of ``jobs`` has succeeded; ``z9 … --wait`` follows them all. So does a
    delete or a cancelled deletion whose dependents react (the jobs of the registry's deletion and
    restore hooks — what another type does with its rows on that resource — are in ``jobs``). Every other 202 makes one job (``jobs`` is
    ``[job]``)."""

    jobs: list[JobRef] = Field(default_factory=list, description="every job the request made, `job` first: the "
                                                                  "request is done when all have succeeded")

    @model_validator(mode="after")
    def _jobs(self) -> "Accepted":
        job = getattr(self, "job", None)
        if not self.jobs and job is not None:
            self.jobs = [job]
        return self


class Step(BaseModel):
    """One step of a job's plan."""

    model_config = ConfigDict(extra="allow", json_schema_serialization_defaults_required=True)

    name: str
    member: str | None = Field(None, description="the member of a multi-VM resource the step acts on (a load "
                                                 "balancer's lb-1, a cluster's cp-0 or workers-2); null for a step "
                                                 "of the resource as a whole")
    state: Literal["pending", "running", "done", "failed", "skipped"]
    started_at: OptTimestamp = None
    finished_at: OptTimestamp = None
    detail: dict[str, Any] = Field(default_factory=dict, description="e.g. the UPID being waited on, the vmid chosen")


class JobErrorBody(BaseModel):
    """Why the last attempt failed."""

    model_config = ConfigDict(extra="allow", json_schema_serialization_defaults_required=True)

    class_: Literal["temporary", "permanent", "snooze", "cancelled"] = Field(
        alias="class", description="cancelled: cancelled by the tenant (POST /v1/jobs/{id}/actions/cancel), or "
                                   "superseded by a later job of the resource (by_job names it)")
    message: str
    at: OptTimestamp = None
    task_log: list[str] | None = None


class JobResource(Response):
    type: str
    id: str


class Job(Response):
    """A job (``GET /v1/jobs/{id}``): status, attempt, steps, error."""

    id: str = Field(pattern=r"^job_[0-9a-z]{26}$")
    kind: str
    region: str
    resource: JobResource | None
    status: JobStatus
    attempt: int
    max_attempts: int
    run_after: OptTimestamp = Field(description="while pending or retry: when it may run")
    steps: list[Step]
    error: JobErrorBody | None
    created_at: Timestamp
    started_at: OptTimestamp
    finished_at: OptTimestamp
    updated_at: Timestamp
    actor: str | None = Field(description="the API token that asked for the job (null: z9 itself)")
    request_id: str | None = Field(description="the X-Request-Id of that request")


class JobList(Response):
    """A page of jobs, oldest first."""

    jobs: list[Job]
    next_after: str | None = Field(description="pass as `after` for the next page (a page token that stays valid "
                                               "after old jobs are pruned); null on the last")


# ---------------------------------------------------------------------------------- errors

class ErrorDetail(Response):
    code: str = Field(description="machine-readable, one per precondition across kinds: not_found, conflict, "
                                  "validation_failed, uniqueness_error (a name taken), resource_deleting (the resource "
                                  "is being or was deleted; details name it), quota_exceeded, not_deleting and "
                                  "deletion_expired (a cancel-deletion with no deletion to cancel, or too late), too_many_jobs (a "
                                  "resource's queue is full), …. "
                                  "Changed: those two were `conflict`; a taken "
                                  "name on POST /servers was `conflict`; `server_deleting`, `address_deleting`, "
                                  "`load_balancer_deleting` and `cluster_deleting` are `resource_deleting`")
    message: str = Field(description="names the field or the precondition")
    details: list[dict[str, Any]] = Field(default_factory=list, description=(
        "always a list of objects ([] when there is nothing more): each names what it is about — `field` (422), "
        "`limit`/`quota`/`used`/`requested` (quota_exceeded), `kind`/`id`/`status` (resource_deleting), `pool`…"))


class Error(Response):
    """Every error answer."""

    error: ErrorDetail


class Health(Response):
    status: Literal["ok"]
