"""The z9 customer client: a typed HTTP client (:class:`Client`) of every kind — servers,
addresses, load balancers, clusters, jobs, tokens, quota — and the ``z9`` customer commands built
on it (:mod:`z9.client.cli`)."""
from .api import ApiError, Client, Conflict, Deadline, Unreachable
from .models import (ADDRESSES, CLUSTERS, LOAD_BALANCERS, SERVERS, Accepted, Address, Cluster, Job, JobRef, Kubeconfig,
                     LoadBalancer, Page, Quota, ResourceKind, Server, ServerCreate, Step, Token, TokenCreate,
                     TokenCreated)

__all__ = ["ApiError", "Client", "Conflict", "Deadline", "Unreachable", "Accepted", "Address", "Cluster", "Job",
           "JobRef", "Kubeconfig", "LoadBalancer", "Page", "Quota", "ResourceKind", "Server", "ServerCreate", "Step",
           "Token", "TokenCreate", "TokenCreated", "SERVERS", "ADDRESSES", "LOAD_BALANCERS", "CLUSTERS"]
