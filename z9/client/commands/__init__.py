"""One module per customer command group; each has ``register(sub, common, waiting) -> name``.

A resource kind's module declares a :class:`~._kind.KindSpec` (``KIND``: its REST shape, columns,
fields, create/update flags and actions) and ``register = KIND.register``: that one declaration is
all the client knows of the kind. A resource kind's module is its slice's ``client.py``
(``resources/z9/resources/<type>/client.py``); :data:`COMMANDS` lists them from the type registry."""
from . import catalog, context, jobs, tokens
from z9 import resources

from types import SimpleNamespace

images = SimpleNamespace(register=catalog.register_images)

COMMANDS = (*(m for _, m in resources.slice_modules("client")), jobs, tokens, catalog, images, context)
"""The command groups: each registered resource type's ``client`` module (its slice's
``client.py``), in the registry's order, then the generic ones."""
