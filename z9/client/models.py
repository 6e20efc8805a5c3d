"""Typed answers of the z9 REST API (``/v1``), for the client.

Request bodies are the API's own models (:class:`z9.api.schemas.ServerCreate`,
:class:`z9.api.tokens.TokenCreate`), so what the client sends is validated by the very rules the
API applies. Answers are parsed into the models below; they allow fields they do not know
(``extra="allow"``), so a newer API with more fields does not break an older client.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from z9.api.schemas import ServerCreate
from z9.api.tokens import Token, TokenCreate, TokenCreated

__all__ = ["ServerCreate", "Token", "TokenCreate", "TokenCreated", "Step", "JobError", "Job", "JobRef",
           "Observed", "Server", "Accepted", "Page", "TERMINAL"]

TERMINAL = ("succeeded", "failed")


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Step(_Answer):
    """One step of a job: ``state`` pending, running, done, failed or skipped; ``detail`` holds
    e.g. the UPID waited on."""

    name: str
    state: str
    started_at: datetime | None = None
    finished_at: datetime | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


class JobError(_Answer):
    """Why a job failed or is retrying: ``class_`` (``class`` in JSON) temporary, permanent or
    snooze."""

    class_: str = Field(alias="class")
    message: str
    at: datetime | None = None


class ResourceRef(_Answer):
    type: str
    id: str


class JobRef(_Answer):
    """The ``job`` of a 202 answer."""

    id: str
    kind: str
    status: str


class Job(_Answer):
    id: str
    kind: str
    region: str
    status: str
    attempt: int = 0
    max_attempts: int = 1
    resource: ResourceRef | None = None
    run_after: datetime | None = None
    steps: list[Step] = Field(default_factory=list)
    error: JobError | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime | None = None
    actor: str | None = None
    request_id: str | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class Observed(_Answer):
    vmid: int | None = None
    node: str | None = None
    power_state: str | None = None
    at: datetime | None = None


class Server(_Answer):
    id: str
    name: str
    region: str
    image: str
    cores: int
    memory_mib: int
    disk_gib: int
    ssh_keys: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    status: str
    status_reason: str | None = None
    observed: Observed = Field(default_factory=Observed)
    delete_after: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    deleted_at: datetime | None = None


class Address(_Answer):
    id: str
    name: str | None = None
    region: str
    pool: str
    family: int
    ip: str
    kind: str
    server_id: str | None = None
    dns_ptr: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    status: str
    status_reason: str | None = None
    delete_after: datetime | None = None
    created_at: datetime | None = None


T = TypeVar("T")


class Accepted(_Answer, Generic[T]):
    """A 202: the resource as it is now and the job that will change it."""

    resource: T
    job: JobRef
    # every job the request made, ``job`` first (the API's ``jobs``): what was asked for is in
    # place when all have succeeded (a server with a public IPv4 address: ServerCreate, AddressAssign)
    jobs: list[JobRef] = Field(default_factory=list)


class Page(_Answer, Generic[T]):
    """One page of a listing; pass ``next_after`` as ``after`` for the next (None: last page)."""

    items: list[T]
    next_after: str | None = None
