"""The z9 REST API (``/v1``): validates, allocates, and writes resource + job + NOTIFY in one
transaction, answering ``202 {"<resource>": …, "job": …}``. Clients poll ``/v1/jobs/{id}``."""
