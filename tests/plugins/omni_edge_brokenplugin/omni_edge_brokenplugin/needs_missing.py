"""A stage kind whose module cannot be imported: it needs a package that is not installed."""

import omni_edge_no_such_dependency  # noqa: F401  (the point: this import fails)


class BrokenKind:  # pragma: no cover - never reached
    kind = "broken_import"
