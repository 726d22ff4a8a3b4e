"""Stages on the CPU, the iGPU and the NPU share host RAM: each fits alone,
together they do not, and the refusal names all three with their bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.config import load_config
from orchestrator.core.errors import RefusalCode
from orchestrator.core.units import GiB, MiB, fmt_bytes
from orchestrator.planner import plan_pipeline
from tests.helpers.checkpoints import llama_config, write_checkpoint
from tests.helpers.profiles import make_profile

onnx = pytest.importorskip("onnx")

IGPU = {
    "id": "igpu:0",
    "kind": "igpu",
    "name": "Intel Arc 140V",
    "vendor": "intel",
    "backends": ["ort-openvino"],
}
NPU = {
    "id": "npu:0",
    "kind": "npu",
    "name": "Intel NPU 4",
    "vendor": "intel",
    "backends": ["ort-openvino"],
}


def exported_artifact(directory: Path, floats: int) -> Path:
    """A one-Add graph whose initializer holds ``floats`` fp32 values."""
    from onnx import TensorProto, helper

    directory.mkdir(parents=True)
    w = helper.make_tensor(
        "W", TensorProto.FLOAT, [floats], np.zeros(floats, np.float32).tobytes(), raw=True
    )
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [floats])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [floats])
    graph = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y"])], "g", [x], [y], [w])
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
        directory / "fp32.onnx",
    )
    np.savez(directory / "ref.npz", x=np.ones(floats, np.float32))
    (directory / "manifest.yaml").write_text(
        yaml.safe_dump(
            {
                "format": "omni-edge.export/1",
                "name": directory.name,
                "version": "1",
                "source": {"origin": "built by this test", "license": "Apache-2.0"},
                "precisions": {"fp32": "fp32.onnx"},
                "inputs": [{"name": "x", "dtype": "float32", "shape": [floats]}],
                "outputs": [{"name": "y", "dtype": "float32", "shape": [floats]}],
                "reference": {"inputs": "ref.npz"},
                "tolerance": {"rel_l2": 1e-4, "max_abs": 1e-4, "cosine_min": 0.9999},
            }
        )
    )
    return directory


def pipeline(tmp_path: Path) -> Path:
    ckpt = write_checkpoint(
        tmp_path / "llm",
        llama_config(),
        {f"w{i}": ("BF16", [1024, 1024]) for i in range(256)},
        files=4,
    )
    asr = exported_artifact(tmp_path / "asr", 16 * 2**20)
    vocoder = exported_artifact(tmp_path / "vocoder", 24 * 2**20)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"""name: three-pools-one-ram
stages:
  - {{name: asr, kind: exported_graph, artifact: {asr}, devices: [npu:0]}}
  - {{name: thinker, kind: ar_decode, model: {ckpt}, devices: [cpu], max_model_len: 4096, inputs: [asr], final_output: true}}
  - {{name: vocoder, kind: exported_graph, artifact: {vocoder}, devices: [igpu:0], inputs: [thinker], final_output: true}}
""")
    return cfg


def test_three_stages_that_fit_alone_are_refused_together(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_EDGE_CACHE_DIR", str(tmp_path / "cache"))
    cfg = load_config(pipeline(tmp_path))
    roomy = plan_pipeline(cfg, make_profile(IGPU, NPU, ram_available=64 * GiB, ram_total=96 * GiB))
    assert roomy.admitted
    assert {s.name: s.device for s in roomy.stages} == {
        "asr": "npu:0",
        "thinker": "cpu",
        "vocoder": "igpu:0",
    }
    host = next(p for p in roomy.pools if p.id == "host_ram")
    shares = {name: host.contributors[name] for name in ("asr", "thinker", "vocoder")}
    assert all(b > 64 * MiB for b in shares.values())

    # one MiB less than all three need together: any one (or two) would fit
    tight = make_profile(IGPU, NPU, ram_available=host.peak_bytes - MiB, ram_total=96 * GiB)
    for name in shares:
        alone = plan_pipeline(
            cfg.model_copy(
                update={
                    "stages": [
                        s.model_copy(update={"inputs": ["request"], "final_output": True})
                        for s in cfg.stages
                        if s.name == name
                    ]
                }
            ),
            tight,
        )
        assert alone.admitted, name

    plan = plan_pipeline(cfg, tight)
    assert not plan.admitted
    for name in shares:
        stage = plan.stage(name)
        assert not stage.admitted
        [refusal] = stage.refusals
        assert refusal.code == RefusalCode.BUDGET_EXCEEDS_DEVICE
        assert "host_ram cannot hold every stage placed on it" in refusal.message
        for other, other_share in shares.items():
            assert f"{other} {fmt_bytes(other_share)}" in refusal.message
        assert f"> {fmt_bytes(host.peak_bytes - MiB)} (1.0 MiB short)" in refusal.message
        assert "asr, thinker, vocoder" in refusal.remedy or all(n in refusal.remedy for n in shares)
