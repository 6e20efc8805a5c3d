"""One module per customer command group; each has ``register(sub, common, waiting) -> name``.
A new resource is a new module here and one more entry in ``COMMANDS``."""
from . import context, jobs, servers, tokens

COMMANDS = (servers, jobs, tokens, context)
