"""Imported by tests/orchestrator/runtime/test_device_actor_imports.py: takes 0.2 s, notes its span."""

import time

from tests.helpers.slow_imports import SPANS

_t0 = time.perf_counter()
time.sleep(0.2)
SPANS.append(("b", _t0, time.perf_counter()))
