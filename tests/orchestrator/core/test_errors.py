from __future__ import annotations

import pickle

from orchestrator.core.errors import ConfigError, RefusalCode, StageFailed


def test_stage_failed_survives_pickling_with_its_fields():
    err = pickle.loads(pickle.dumps(StageFailed("voice", "npu:0", "session failed to open")))
    assert (err.stage, err.device, err.cause) == ("voice", "npu:0", "session failed to open")
    assert str(err) == "stage 'voice' on npu:0 failed: session failed to open"


def test_config_error_prints_where_what_and_fix():
    err = ConfigError.single(
        "p.yaml: stages[0].devices", "'tpu:0' is not a device id", "use cpu, gpu:N, igpu:N or npu:N"
    )
    assert (
        str(err)
        == "p.yaml: stages[0].devices: 'tpu:0' is not a device id\n  how to fix: use cpu, gpu:N, igpu:N or npu:N"
    )


def test_refusal_codes_are_unique_and_include_the_contract_ones():
    assert len(RefusalCode.__members__) == len(set(RefusalCode))
    assert {
        "no_runnable_device",
        "weight_format_unsupported",
        "budget_exceeds_device",
        "config_unreadable",
        "no_exported_graph",
        "execution_provider_declined_graph",
        "numeric_gate_failed",
        "device_unreachable_from_this_process",
    } <= set(RefusalCode)


def test_every_refusal_code_is_documented_and_every_documented_code_exists():
    import re

    from tests.helpers import REPO

    table = (REPO / "docs" / "refusals.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.M))
    assert documented == set(RefusalCode)
