"""Stage kinds for omni-edge's tests, shipped as a plugin distribution.

Each kind is listed under the ``omni_edge.stage_kinds`` entry-point group in
this package's ``pyproject.toml``; omni-edge finds it there the first time a
config names it (``stages.registry``). See docs/architecture.md, "Adding a
stage kind".
"""
