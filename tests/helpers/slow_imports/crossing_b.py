"""The second load's import: once the first load is inside ``crossing`` (or this load is
held back), import ``crossing.sub`` itself — the other end of the cycle (see ``marks``).
By its full name: Python then finds the package already in ``sys.modules`` and runs the
submodule without waiting for the package to finish (``from crossing import sub`` would
wait for it first)."""

import importlib

from tests.helpers.slow_imports import marks

marks.until(lambda: "parent" in marks.NOTED or marks.held_back())

THING = importlib.import_module("tests.helpers.slow_imports.crossing.sub").thing
