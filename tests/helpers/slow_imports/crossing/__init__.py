"""A package whose import imports its submodule ``sub`` (see ``marks``)."""

from tests.helpers.slow_imports import marks

helper = "helper"
marks.note("parent")
# until the other load is inside sub and blocked on this package, or held back by the lock
marks.until(lambda: marks.blocked("sub wants the parent") or marks.held_back())

from tests.helpers.slow_imports.crossing.sub import thing  # noqa: E402

__all__ = ["helper", "thing"]
