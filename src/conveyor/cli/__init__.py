"""The ``conveyor`` command line: thin commands over the public API.

Each command group lives in its own module and registers itself on :data:`main` here.
"""

from __future__ import annotations

from . import acl as _acl  # noqa: F401
from . import chaos as _chaos  # noqa: F401  (registers commands)
from . import dashboard as _dashboard  # noqa: F401
from . import demo as _demo  # noqa: F401
from . import doctor as _doctor  # noqa: F401
from . import flow as _flow  # noqa: F401
from . import inspect as _inspect  # noqa: F401
from . import observe as _observe  # noqa: F401
from . import reseal as _reseal  # noqa: F401
from . import shards as _shards  # noqa: F401
from . import top as _top  # noqa: F401
from . import waits as _waits  # noqa: F401
from . import worker as _worker  # noqa: F401
from . import workflow as _workflow  # noqa: F401
from .base import main

__all__ = ["main"]
