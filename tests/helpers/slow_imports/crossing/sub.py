"""Takes a name from its parent package, which imports it (see ``marks``)."""

from tests.helpers.slow_imports import marks

marks.note("sub wants the parent")

from tests.helpers.slow_imports.crossing import helper  # noqa: E402

thing = f"{helper} and thing"
