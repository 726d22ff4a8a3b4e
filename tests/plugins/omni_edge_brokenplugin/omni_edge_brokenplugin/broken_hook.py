"""A hook module that raises while it is imported."""

raise RuntimeError("the broken hook's module raises on import, on purpose")


def preprocess(item: object) -> object:  # pragma: no cover - never reached
    return item
