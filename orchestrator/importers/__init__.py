"""Importers: other projects' pipeline configs turned into omni-edge configs
(``omni-edge import``). Each maps what has a meaning here and lists, one line
each, what has none."""
