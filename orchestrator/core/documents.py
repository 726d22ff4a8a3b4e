"""JSON documents on their way out of the program.

:data:`JsonObject` is a JSON object the program writes to a file (a run record, a plan, an
evidence record, an artifact's manifest, an imported config), sends to a client (an HTTP
response, a realtime event, a request to a running server) or prints (``--json``). Its keys
are documented where it is written and in the docs that describe the format (docs/runtime.md,
docs/plan-format.md, docs/serve.md, ...); the program may read back what it wrote before the
document leaves, but data that stays inside the program is typed (dataclasses, TypedDicts,
pydantic models), never a ``JsonObject``. ``scripts/structure_report.py`` counts the alias
apart from ``dict[str, Any]``, so neither figure hides the other.
"""

from __future__ import annotations

from typing import Any, TypeAlias

JsonObject: TypeAlias = dict[str, Any]
"""A JSON object on its way out of the program (see the module docstring)."""
