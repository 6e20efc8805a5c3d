"""One module per customer command group; each has ``register(sub, common, waiting) -> name``.
A new resource is a new module here and one more entry in ``COMMANDS``."""
from . import addresses, catalog, context, jobs, servers, tokens

from types import SimpleNamespace

images = SimpleNamespace(register=catalog.register_images)

COMMANDS = (servers, addresses, jobs, tokens, catalog, images, context)
