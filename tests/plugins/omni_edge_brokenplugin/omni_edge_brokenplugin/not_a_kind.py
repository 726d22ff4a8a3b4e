"""An entry point that imports fine but names something that is not a stage kind."""


class NotAKind:
    """Not a ``stages.base.StageKind``."""

    kind = "not_a_kind"
