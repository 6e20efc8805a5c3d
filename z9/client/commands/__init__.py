"""One module per customer command group; each has ``register(sub, common, waiting) -> name``.

A resource kind's module declares a :class:`~._kind.KindSpec` (``KIND``: its REST shape, columns,
fields, create/update flags and actions) and ``register = KIND.register``: that one declaration is
all the client knows of the kind, so a new kind is a new module here and one more entry in
``COMMANDS``."""
from . import addresses, catalog, clusters, context, jobs, load_balancers, servers, tokens, volumes

from types import SimpleNamespace

images = SimpleNamespace(register=catalog.register_images)

COMMANDS = (servers, addresses, load_balancers, clusters, volumes, jobs, tokens, catalog, images, context)
