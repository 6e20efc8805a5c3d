"""Shared code of every z9 service: settings, ids, errors, tags, backoff, SQL and the job model."""
