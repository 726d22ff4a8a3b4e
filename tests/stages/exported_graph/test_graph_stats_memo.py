"""The graph-statistics memo cannot hold stale or edited numbers: it is keyed like the
GGUF memo (size, mtime, ctime, inode, device) and its values are checked when read."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stages.exported_graph.graph_stats import _memo_path, describe_graph

MIB = 1 << 20


def big_graph(path: Path, seed: int = 0) -> Path:
    """MatMul by a 1024 × 512 float32 weight: 2 MiB of initializers."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.RandomState(seed).randn(1024, 512).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 512])],
        [numpy_helper.from_array(w, "W")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_graph_rewritten_with_the_same_size_and_mtime_gets_its_new_digest(tmp_path: Path) -> None:
    graph = big_graph(tmp_path / "g.onnx")
    first = describe_graph(graph)
    st = graph.stat()
    data = bytearray(graph.read_bytes())
    data[-100] ^= 0xFF  # a weight byte: same size, still a valid graph
    graph.write_bytes(bytes(data))
    os.utime(graph, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (graph.stat().st_size, graph.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    again = describe_graph(graph)
    assert again.sha256 != first.sha256
    assert again.sha256 == describe_graph(graph, use_cache=False).sha256


def _edit_memo(graph: Path, **stats: Any) -> Path:
    memo = _memo_path(graph.resolve())
    record = json.loads(memo.read_text())
    record["stats"].update(stats)
    memo.write_text(json.dumps(record))
    return memo


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ({"initializer_bytes": 1}, "initializer_bytes 1 leaves"),
        ({"initializer_bytes": 10 * MIB}, "exceeds the file bytes"),
        ({"initializer_bytes": -5}, "not a non-negative integer"),
        ({"initializer_bytes": "2MiB"}, "not a non-negative integer"),
        ({"file_bytes": 100}, "file_bytes 100 is not the"),
        ({"node_count": 7}, "op histogram does not add up"),
        ({"sha256": "0" * 10}, "sha256 is not a hex digest"),
        ({"bogus": 1}, "TypeError"),
    ],
)
def test_an_edited_memo_is_recomputed_with_a_warning(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    edit: dict[str, Any],
    why: str,
) -> None:
    graph = big_graph(tmp_path / "g.onnx")
    truth = describe_graph(graph)
    assert truth.initializer_bytes == 1024 * 512 * 4
    memo = _edit_memo(graph, **edit)
    with caplog.at_level(logging.WARNING):
        again = describe_graph(graph)
    assert again == truth
    assert any(
        str(memo) in m and str(graph) in m and why in m and "reading the graph again" in m
        for m in caplog.messages
    )
    # and the memo is rewritten with the true numbers
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert describe_graph(graph) == truth
    assert caplog.messages == []


def test_a_real_graph_beyond_the_plausibility_bound_is_read_again_not_flagged(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Megabytes of metadata and no weights: true numbers the memo check would call
    implausible are never memoised, so no warning accuses them of being edited."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "meta",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.doc_string = "x" * (2 * MIB)
    path = tmp_path / "meta.onnx"
    onnx.save(model, path)
    with caplog.at_level(logging.WARNING):
        first = describe_graph(path)
        assert describe_graph(path) == first
    assert first.initializer_bytes == 0 and caplog.messages == []
    assert not _memo_path(path.resolve()).exists()


def external_graph(directory: Path, seed: int = 0) -> tuple[Path, Path]:
    """``big_graph`` with its 2 MiB of weights in an external data file beside it."""
    import onnx

    directory.mkdir(parents=True, exist_ok=True)
    graph = big_graph(directory / "g.onnx", seed)
    model = onnx.load(str(graph))
    onnx.save(model, str(graph), save_as_external_data=True, location="g.data")
    return graph, directory / "g.data"


def test_external_data_changed_while_it_was_hashed_is_read_again_never_memoised_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stages.exported_graph import graph_stats

    graph, data = external_graph(tmp_path)
    new_weights = external_graph(tmp_path / "other", seed=1)[1].read_bytes()
    assert len(new_weights) == data.stat().st_size and new_weights != data.read_bytes()
    real = graph_stats.file_sha256
    rewrites = []

    def hash_then_rewrite(path: Any, *args: Any) -> str:
        digest = real(path, *args)
        if Path(path) == data.resolve() and not rewrites:  # new weights land right after the hash
            data.write_bytes(new_weights)
            rewrites.append(path)
        return digest

    monkeypatch.setattr(graph_stats, "file_sha256", hash_then_rewrite)
    stats = describe_graph(graph)
    monkeypatch.setattr(graph_stats, "file_sha256", real)
    truth = describe_graph(graph, use_cache=False).sha256
    assert rewrites and stats.sha256 == truth  # read again: the digest of what is there
    assert describe_graph(graph).sha256 == truth  # and the memo holds that one


def test_a_graph_whose_files_keep_changing_while_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.core.errors import ConfigError
    from stages.exported_graph import graph_stats

    graph, data = external_graph(tmp_path)
    real = graph_stats.file_sha256

    def hash_then_touch(path: Any, *args: Any) -> str:
        digest = real(path, *args)
        if Path(path) == data.resolve():  # a writer that never stops
            data.write_bytes(data.read_bytes())
        return digest

    monkeypatch.setattr(graph_stats, "file_sha256", hash_then_touch)
    with pytest.raises(ConfigError) as refused:
        describe_graph(graph)
    assert "changed while it was read, 3 times" in str(refused.value)
    assert not _memo_path(graph.resolve()).exists()
