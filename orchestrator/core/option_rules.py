"""Which provider options may reach ONNX Runtime, and from whom: the rules behind each
backend row's ``options`` (``orchestrator.core.backends``).

A provider option can make an EP load native code (QNN's ``backend_path``), choose what it
loads (VitisAI's ``config_file``, ``xclbin``) or write files (OpenVINO's ``cache_dir``, its
``CACHE_DIR`` property). A pipeline config is not trusted with any of that: it may give only
the options a row declares, a cache directory only inside omni-edge's cache, and OpenVINO
properties from :data:`OPENVINO_PROPERTIES`; a file to load only ever comes from the user's
own settings file (``orchestrator.core.settings``). Refusals say where, what and how to fix
(exit 2 when the config is read).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from orchestrator.core import settings
from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import ep_cache_dir

OptionKind = Literal["value", "cache_dir", "user_file", "ov_config"]
"""What a provider option's value is, which decides who may give it:

* ``value``: a setting (a device filter, a thread count): a pipeline config may give it;
* ``cache_dir``: where the EP writes compiled blobs: a config may give it only inside
  omni-edge's cache (``settings.cache_root``), the user's settings anywhere;
* ``user_file``: a file the EP loads as native code or that chooses what is loaded (QNN's
  ``backend_path``, VitisAI's ``config_file`` and ``xclbin``): only the user's settings may
  name one, never a pipeline config;
* ``ov_config``: OpenVINO's ``load_config``, a JSON object of device → properties, each
  property among :data:`OPENVINO_PROPERTIES` (``CACHE_DIR`` confined like ``cache_dir``)."""

OPENVINO_PROPERTIES = frozenset(
    {
        "INFERENCE_PRECISION_HINT",
        "PERFORMANCE_HINT",
        "PERFORMANCE_HINT_NUM_REQUESTS",
        "EXECUTION_MODE_HINT",
        "NUM_STREAMS",
        "INFERENCE_NUM_THREADS",
        "ENABLE_CPU_PINNING",
        "ENABLE_HYPER_THREADING",
        "SCHEDULING_CORE_TYPE",
        "MODEL_PRIORITY",
        "CACHE_MODE",
        "CACHE_DIR",
        "KV_CACHE_PRECISION",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE",
        "LOG_LEVEL",
        "NPU_TURBO",
        "NPU_TILES",
        "NPU_COMPILATION_MODE_PARAMS",
        "GPU_HOST_TASK_PRIORITY",
        "GPU_QUEUE_PRIORITY",
        "GPU_QUEUE_THROTTLE",
    }
)
"""The OpenVINO properties a ``load_config`` may set: settings of the compile and the run. Left
out on purpose: anything naming a file to read or run (the GPU plugin's ``CONFIG_FILE`` loads
custom OpenCL kernels, ``WEIGHTS_PATH`` reads weights from elsewhere)."""


class Row(Protocol):
    """What these rules read of a backend row (``orchestrator.core.backends.Row``)."""

    @property
    def backend(self) -> str: ...
    @property
    def ep(self) -> str: ...
    @property
    def options(self) -> Mapping[str, OptionKind]: ...


def _inside_cache(value: str, backend_name: str) -> bool:
    """Whether a cache directory (relative ones under the backend's own cache) lies inside
    omni-edge's cache, ``..`` resolved (links are the cache owner's own)."""
    root = os.path.normpath(os.path.abspath(settings.cache_root()))
    here = os.path.normpath(os.path.join(ep_cache_dir(backend_name), os.path.expanduser(value)))
    return here == root or here.startswith(root.rstrip(os.sep) + os.sep)


def config_problem(row: Row, option: str, value: Any) -> tuple[str, str] | None:
    """(what, how to fix) when a pipeline config may not give ``row``'s backend the provider
    option ``option`` = ``value``; None when it may. Only what the row declares
    (``Row.options``) passes: a library path only from the user's settings, a cache
    directory only inside omni-edge's cache, OpenVINO properties from an allow-list."""
    backend_name = row.backend
    kind = row.options.get(option)
    at = f"{backend_name}.{option}"
    settings_file = settings.settings_path()
    if kind is None:
        return (
            f"{at} is not an option omni-edge passes to {row.ep}",
            f"use one of {', '.join(sorted(row.options)) or 'none (this EP takes none)'}",
        )
    if kind == "user_file":
        return (
            f"{at} names a file {row.ep} loads (native code, or what chooses it): a pipeline "
            "config cannot choose one",
            f"remove it from the config; to use your own, set provider_options: {{{backend_name}: "
            f"{{{option}: PATH}}}} in your settings file {settings_file}",
        )
    if kind == "cache_dir" and not _inside_cache(str(value), backend_name):
        return (
            f"{at}: {str(value)!r} is outside omni-edge's cache ({settings.cache_root()}): a "
            "pipeline config cannot make the EP write elsewhere",
            f"leave it out (compiled blobs go to {ep_cache_dir(backend_name)}), or set it in your "
            f"settings file {settings_file}",
        )
    if kind == "ov_config":
        return _ov_config_problem(at, str(value), backend_name)
    return None


def _ov_config_problem(at: str, text: str, backend_name: str) -> tuple[str, str] | None:
    try:
        config = json.loads(text)
    except ValueError:
        return None  # not JSON: session_spec says what load_config must be (_add_precision_hint)
    if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
        return None
    for device, properties in config.items():
        for name, value in properties.items():
            if name not in OPENVINO_PROPERTIES:
                return (
                    f"{at}: {device}.{name} is not an OpenVINO property omni-edge passes",
                    f"use {', '.join(sorted(OPENVINO_PROPERTIES))}",
                )
            if name == "CACHE_DIR" and not _inside_cache(str(value), backend_name):
                return (
                    f"{at}: {device}.CACHE_DIR {str(value)!r} is outside omni-edge's cache "
                    f"({settings.cache_root()}): a pipeline config cannot make OpenVINO write elsewhere",
                    f"leave it out (cache_dir is {ep_cache_dir(backend_name)} already)",
                )
    return None


def user_options(backend_name: str, table: Mapping[str, Row]) -> dict[str, str]:
    """The provider options the user's settings give ``backend_name`` (any the row declares, a
    ``user_file`` too); ``ConfigError`` naming the settings file for a backend or an option
    omni-edge does not know (a typo there must not pass silently)."""
    given = settings.user_settings()
    for name, options in given.provider_options.items():
        if name not in table:
            raise ConfigError.single(
                f"{given.path}: provider_options.{name}",
                "is not an ONNX Runtime backend",
                f"use one of {', '.join(table)}",
            )
        unknown = sorted(set(options) - set(table[name].options))
        if unknown:
            raise ConfigError.single(
                f"{given.path}: provider_options.{name}.{unknown[0]}",
                f"is not an option omni-edge passes to {table[name].ep}",
                f"use one of {', '.join(sorted(table[name].options)) or 'none'}",
            )
    return dict(given.provider_options.get(backend_name, {}))
