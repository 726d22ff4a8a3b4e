"""The runtime: carries out an admitted plan on a Ray cluster.

* ``cluster``: start or join Ray (loopback, dashboard off, bounded object
  store), the custom resources that name this project's devices, and Ray's
  own memory, measured.
* ``ledger_actor``: the planning ledger's class behind one actor.
* ``device_actor``: one actor per device; hosts the stages placed there.
* ``runtime``: starts the actors, loads the stages under reservations and
  streams requests stage to stage.
* ``startup``: what ``Runtime.start`` does — the actors created together, the
  loads in the waves the ledger admits together, progress through a callback.
* ``events`` / ``record``: what a request yields, and the run record.

Importing this package imports nothing heavy; Ray is imported by the modules
that need it.
"""
