"""Clients of a running ``omni-edge serve``: ``realtime`` is the client half of a
``/v1/realtime`` session (``chat --audio-in``, ``bench/voice_latency.py``)."""
