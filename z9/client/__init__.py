"""The z9 customer client: a typed HTTP client (:class:`Client`) and the ``z9 servers|jobs|tokens|
context`` commands built on it (:mod:`z9.client.cli`)."""
from .api import ApiError, Client, Conflict, Deadline, Unreachable
from .models import Accepted, Job, JobRef, Page, Server, ServerCreate, Step, Token, TokenCreate, TokenCreated

__all__ = ["ApiError", "Client", "Conflict", "Deadline", "Unreachable", "Accepted", "Job", "JobRef", "Page",
           "Server", "ServerCreate", "Step", "Token", "TokenCreate", "TokenCreated"]
