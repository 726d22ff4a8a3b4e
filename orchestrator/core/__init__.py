"""The ground every other part of omni-edge stands on: no module here imports one above it.

Two layers (``pyproject.toml``'s import-linter contracts hold them):

* **core data**, the contracts planning and running share: ``plan`` (the plan,
  ``omni-edge.plan/1``), ``ledger`` (pools, reservations, admission), ``profile``
  (the hardware profile, ``omni-edge.profile/1``), ``cpu_threads`` (the CPU's cores
  split among the CPU stages), over ``backends`` (the EP vocabulary: one row per
  ONNX Runtime backend);
* **the bottom**, which imports nothing else of the project: ``errors`` (the
  exception tree and refusal codes), ``units``, ``fileio`` (atomic writes, locks),
  ``settings`` (the environment and cache paths), ``validation`` (pydantic errors
  as where → what → how), ``memory`` (RSS/PSS), ``console`` (the one rich
  console), ``packages`` (``package://`` locations, the ONNX Runtime flavour),
  ``extras`` (which optional package each command needs).

Stage kinds (``stages/``), the ONNX Runtime layer (``orchestrator/ort/``), the
probe and the planner all stand on these.
"""
