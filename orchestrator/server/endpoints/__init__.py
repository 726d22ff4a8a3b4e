"""The HTTP endpoints of ``serve``, one module per group, each with its ``routes(served)``:
``chat`` (``/v1/chat/completions``), ``speech`` (``/v1/audio/speech``), ``info`` (``/health``,
``/v1/models``, ``/v1/plan``, ``/v1/status``, ``/metrics``). ``app.create_app`` composes them."""
