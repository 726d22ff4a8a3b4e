"""Bad input never gets past the door: exit 2, one readable error, nothing written.

Every case builds the file it needs, runs the CLI in-process
(``orchestrator.cli.main``) and asserts what the user reads: exit code 2, the
file and the place named, a ``how to fix`` line, no traceback, and the
``--out`` file never created.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.core.errors import ConfigError
from orchestrator.core.fileio import check_writable
from orchestrator.core.units import GiB
from tests.helpers.checkpoints import llama_config, write_checkpoint

PROFILE: dict[str, Any] = {
    "format": "omni-edge.profile/1",
    "name": "bad-input box",
    "host": {"os": "linux", "ram_total_bytes": 32 * GiB, "ram_available_bytes": 16 * GiB},
    "devices": [{"id": "cpu", "kind": "cpu", "name": "cpu", "backends": ["vllm-cpu", "ort-cpu"]}],
}


@pytest.fixture(autouse=True)
def _private_cache(private_cache: Path) -> Path:
    return private_cache


def good_inputs(
    tmp_path: Path, *, config: dict[str, Any] | None = None, max_model_len: int = 1024
) -> tuple[Path, Path]:
    """A config and a profile that plan with exit 0; each case breaks one thing."""
    ckpt = write_checkpoint(tmp_path / "m", config or llama_config(), {"w": ("BF16", [64, 64])})
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        "name: bad-inputs\nstages:\n"
        f"  - {{name: thinker, kind: ar_decode, model: {ckpt}, devices: [cpu], max_model_len: {max_model_len}, final_output: true}}\n"
    )
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(PROFILE))
    return cfg, prof


def refused(
    capsys: pytest.CaptureFixture[str], argv: list[str], *mentions: str, out: Path | None = None
) -> str:
    """Run the CLI; assert exit 2, a where → what → fix error naming ``mentions``, no traceback,
    and ``out`` (when given) not written. Returns stderr."""
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err
    assert code == 2, f"exit {code}\nstdout: {captured.out}\nstderr: {err}"
    assert err.startswith("error: "), err
    assert "Traceback" not in err + captured.out
    assert "how to fix:" in err, err
    for m in mentions:
        assert m in err, f"{m!r} not in:\n{err}"
    if out is not None:
        assert not out.exists(), f"{out} was written"
    return err


def test_good_inputs_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, prof = good_inputs(tmp_path)
    assert (
        main(["plan", str(cfg), "--profile", str(prof), "--out", str(tmp_path / "plan.json")]) == 0
    )
    assert (tmp_path / "plan.json").exists()


# ---- where the result goes: checked before any work -----------------------------


@pytest.mark.parametrize(
    "where", ["missing-dir/plan.json", "/proc/plan.json", "DIR", "FILE/plan.json"]
)
def test_plan_out_that_cannot_be_written_is_refused_before_planning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    cfg, prof = good_inputs(tmp_path)
    (tmp_path / "FILE").write_text("x")
    out = Path(where.replace("DIR", str(tmp_path)).replace("FILE", str(tmp_path / "FILE")))
    if not out.is_absolute():
        out = tmp_path / out
    before = sorted(p.name for p in tmp_path.iterdir())
    # the config is broken too: the --out check comes first, before any work
    cfg.write_text("name: [")
    err = refused(
        capsys, ["plan", str(cfg), "--profile", str(prof), "--out", str(out)], "--out", str(out)
    )
    assert "YAML" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("where", ["missing-dir/p.json", "/proc/p.json", "DIR"])
def test_probe_save_that_cannot_be_written_is_refused_before_probing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    import orchestrator.probe as probe

    def no_probe(*a: object, **k: object) -> None:
        raise AssertionError("probed before the --save path was checked")

    monkeypatch.setattr(probe, "probe_profile", no_probe)
    out = Path(where.replace("DIR", str(tmp_path)))
    if not out.is_absolute():
        out = tmp_path / out
    refused(capsys, ["probe", "--save", str(out), "--force"], "--save", str(out))
    assert list(tmp_path.iterdir()) == []


def test_check_writable_leaves_nothing_behind_and_accepts_a_new_file(tmp_path: Path) -> None:
    check_writable(tmp_path / "new.json", what="--out")
    (tmp_path / "old.json").write_text("{}")
    check_writable(tmp_path / "old.json", what="--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


def test_check_writable_names_a_read_only_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # root writes anywhere, so the directory's refusal is simulated at os.open
    import errno
    import os

    real_open = os.open

    def read_only(path: Any, flags: int, mode: int = 0o777) -> int:
        if Path(path).parent == tmp_path / "ro":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_open(path, flags, mode)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(ConfigError) as exc:
        check_writable(tmp_path / "ro" / "plan.json", what="--out")
    text = str(exc.value)
    assert "--out" in text and "Permission denied" in text and "how to fix" in text


# ---- the corpus: one broken file per case, through `omni-edge plan` --------------
#
# Each case gets the good config, profile and checkpoint of good_inputs() and
# breaks one thing; it returns the strings the error must contain (the file,
# and the place inside it). The plan's --out must not be written.

U32, I32, F32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
_SCALAR = {U32: "<I", I32: "<i", F32: "<f", BOOL: "<?"}


def _gstr(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf(meta: list[tuple[str, int, Any]] | None = None, *, n_kv: int | None = None) -> bytes:
    """A GGUF v3 header (no tensor data) whose metadata is ``meta`` (or a tiny llama's)."""
    meta = (
        meta
        if meta is not None
        else [
            ("general.architecture", STRING, "llama"),
            ("llama.block_count", U32, 2),
            ("llama.embedding_length", U32, 64),
            ("llama.attention.head_count", U32, 4),
            ("llama.context_length", U32, 2048),
        ]
    )
    tensors = [("blk.0.attn_q.weight", [64, 64], 1)]
    out = bytearray(
        b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta) if n_kv is None else n_kv)
    )
    for key, vtype, value in meta:
        out += _gstr(key) + struct.pack("<I", vtype)
        if vtype == STRING:
            out += _gstr(value)
        else:
            out += struct.pack(_SCALAR[vtype], value)
    for name, dims, ttype in tensors:
        out += _gstr(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", ttype, 0)
    return bytes(out)


def _llama_meta(**override: tuple[int, Any]) -> list[tuple[str, int, Any]]:
    base: dict[str, tuple[int, Any]] = {
        "general.architecture": (STRING, "llama"),
        "llama.block_count": (U32, 2),
        "llama.embedding_length": (U32, 64),
        "llama.attention.head_count": (U32, 4),
        "llama.context_length": (U32, 2048),
    }
    base.update({k.replace("__", "."): v for k, v in override.items()})
    return [(k, t, v) for k, (t, v) in base.items()]


def safetensors(header: Any, *, length: int | None = None, raw: bytes | None = None) -> bytes:
    body = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(body) if length is None else length) + body


class Case:
    """The files of one case (``tmp``: the test's directory; ``cfg``/``prof``/``ckpt``)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.cfg, self.prof = good_inputs(tmp)
        self.ckpt = tmp / "m"

    def config(self, text: str, name: str = "p.yaml") -> Path:
        self.cfg = self.tmp / name
        self.cfg.write_text(text)
        return self.cfg

    def stage(
        self, extra: str = "", *, model: str | None = None, max_model_len: str = "1024"
    ) -> Path:
        return self.config(
            "name: bad-inputs\nstages:\n"
            f"  - {{name: thinker, kind: ar_decode, model: '{model or self.ckpt}', devices: [cpu], "
            f"max_model_len: {max_model_len}, final_output: true{extra}}}\n"
        )

    def profile(
        self, doc: Any = None, *, raw: bytes | None = None, name: str = "profile.json"
    ) -> Path:
        self.prof = self.tmp / name
        self.prof.write_bytes(raw if raw is not None else json.dumps(doc).encode())
        return self.prof

    def host(self, **host: Any) -> Path:
        return self.profile({**PROFILE, "host": {**PROFILE["host"], **host}})

    def model_config(self, doc: Any = None, *, raw: bytes | None = None) -> Path:
        path = self.ckpt / "config.json"
        path.write_bytes(raw if raw is not None else json.dumps(doc).encode())
        return path

    def text(self, **fields: Any) -> Path:
        return self.model_config(llama_config(**fields))

    def weights(self, data: bytes) -> Path:
        path = self.ckpt / "model.safetensors"
        path.write_bytes(data)
        return path

    def entry(self, **entry: Any) -> Path:
        base: dict[str, Any] = {"dtype": "BF16", "shape": [64, 64], "data_offsets": [0, 8192]}
        base.update(entry)
        return self.weights(safetensors({"w": {k: v for k, v in base.items() if v is not None}}))

    def index(self, doc: Any) -> Path:
        (self.ckpt / "model.safetensors").unlink()
        path = self.ckpt / "model.safetensors.index.json"
        path.write_text(json.dumps(doc))
        return path

    def gguf(self, data: bytes) -> Path:
        path = self.tmp / "model.gguf"
        path.write_bytes(data)
        self.stage(model=str(path))
        return path

    def manifest(self, text: str, files: dict[str, bytes] | None = None) -> Path:
        art = self.tmp / "art"
        art.mkdir(exist_ok=True)
        for name, data in {"ref.npz": b"", **(files or {})}.items():
            (art / name).write_bytes(data)
        (art / "manifest.yaml").write_text(text)
        self.config(
            "name: bad-inputs\nstages:\n"
            f"  - {{name: voice, kind: exported_graph, artifact: {art}, devices: [cpu], final_output: true, final_output_type: audio}}\n"
        )
        return art / "manifest.yaml"


MANIFEST_OK = (
    "format: omni-edge.export/1\nname: tiny\nversion: '1'\nprecisions: {fp32: model.onnx}\n"
    "source: {origin: tests, license: MIT}\nreference: {inputs: ref.npz}\n"
    "inputs: [{name: x, dtype: float32, shape: [1, 4]}]\noutputs: [{name: y, dtype: float32, shape: [1, 4]}]\n"
)


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


CASES: dict[str, Callable[[Case], tuple[str, ...]]] = {}


def case(
    name: str,
) -> Callable[[Callable[[Case], tuple[str, ...]]], Callable[[Case], tuple[str, ...]]]:
    def register(fn: Callable[[Case], tuple[str, ...]]) -> Callable[[Case], tuple[str, ...]]:
        assert name not in CASES
        CASES[name] = fn
        return fn

    return register


def _dir(c: Case, name: str) -> Path:
    d = c.tmp / name
    d.mkdir()
    return d


def _cfg(c: Case, text: str) -> tuple[str, ...]:
    return (str(c.config(text)),)


# -- the pipeline config (CONFIG) --
case("config: a directory")(
    lambda c: (str(setattr(c, "cfg", _dir(c, "cfg.yaml")) or c.cfg), "directory")
)
case("config: not UTF-8")(lambda c: (str(c.config("name: caf\xe9\n")) if False else _non_utf8(c),))
case("config: unreadable")(
    lambda c: (str(setattr(c, "cfg", Path("/proc/self/mem")) or c.cfg), "cannot read")
)
case("config: empty")(lambda c: (*_cfg(c, ""), "mapping"))
case("config: a list")(lambda c: (*_cfg(c, "- name: x\n"), "mapping"))
case("config: YAML syntax")(lambda c: (*_cfg(c, "name: [\n"), "YAML"))
case("config: JSON syntax")(lambda c: (str(c.config('{"name": ', name="p.json")), "JSON"))
case("config: JSON nested too deep")(
    lambda c: (str(c.config(_deep(100_000).decode(), name="p.json")), "nested")
)
case("config: unknown key")(lambda c: (*_cfg(c, c.cfg.read_text() + "colour: blue\n"), "colour"))
case("config: no name")(
    lambda c: (*_cfg(c, c.cfg.read_text().replace("name: bad-inputs\n", "")), "name")
)
case("config: name with ../")(
    lambda c: (
        *_cfg(c, c.cfg.read_text().replace("name: bad-inputs", "name: ../../etc/x")),
        ": name",
    )
)
case("config: name with a slash")(
    lambda c: (*_cfg(c, c.cfg.read_text().replace("name: bad-inputs", "name: a/b")), ": name")
)
case("config: name with a backslash")(
    lambda c: (*_cfg(c, c.cfg.read_text().replace("name: bad-inputs", "name: 'a\\\\b'")), ": name")
)
case("config: name of 300 characters")(
    lambda c: (
        *_cfg(c, c.cfg.read_text().replace("name: bad-inputs", "name: " + "a" * 300)),
        ": name",
    )
)
case("config: name '..'")(
    lambda c: (*_cfg(c, c.cfg.read_text().replace("name: bad-inputs", "name: '..'")), ": name")
)
case("config: name with a NUL")(
    lambda c: (*_cfg(c, c.cfg.read_text().replace("name: bad-inputs", 'name: "a\\0b"')), ": name")
)
case("config: stages empty")(lambda c: (*_cfg(c, "name: x\nstages: []\n"), "stages"))
case("config: stages a mapping")(lambda c: (*_cfg(c, "name: x\nstages: {a: 1}\n"), "stages"))
case("config: a stage is a string")(
    lambda c: (*_cfg(c, "name: x\nstages: [thinker]\n"), "stages[0]")
)
case("config: unknown kind")(
    lambda c: (
        *_cfg(c, c.cfg.read_text().replace("kind: ar_decode", "kind: warp_drive")),
        "stages[0].kind",
    )
)
case("config: negative max_model_len")(
    lambda c: (str(c.stage(max_model_len="-5")), "max_model_len")
)
case("config: max_model_len 10^40")(
    lambda c: (str(c.stage(max_model_len=str(10**40))), "max_model_len")
)
case("config: max_num_seqs 0")(lambda c: (str(c.stage(", max_num_seqs: 0")), "max_num_seqs"))
case("config: a device that is no device id")(
    lambda c: (*_cfg(c, c.cfg.read_text().replace("devices: [cpu]", "devices: [tpu:0]")), "devices")
)
case("config: replicas 0")(lambda c: (str(c.stage(", replicas: 0")), "stages[0].replicas"))
case("config: replicas 17")(
    lambda c: (str(c.stage(", replicas: 17")), "stages[0].replicas", "less than or equal to 16")
)
case("config: replicas as a string")(
    lambda c: (str(c.stage(", replicas: '2'")), "stages[0].replicas")
)
case("config: an input that is no stage")(lambda c: (str(c.stage(", inputs: [ghost]")), "ghost"))
case("config: model directory missing")(
    lambda c: (c.stage(model=str(c.tmp / "nowhere")), str(c.tmp / "nowhere"), "not found")[1:]
)
case("config: stage_args not a list")(
    lambda c: (*_cfg(c, "name: x\nstage_args: true\n"), "stage_args")
)
case("config: engine_args not a mapping")(
    lambda c: (
        *_cfg(c, "name: x\nstage_args: [{stage_id: 0, engine_args: [1]}]\n"),
        ": stage_args",
        "omni-edge import vllm-omni",
    )
)
case("config: engine_input_source of lists")(
    lambda c: (
        *_cfg(c, "name: x\nstage_args: [{stage_id: 0, engine_input_source: [[0]]}]\n"),
        ": stage_args",
        "omni-edge import vllm-omni",
    )
)
case("config: max_tokens not below max_model_len")(
    lambda c: (str(c.stage(", sampling: {max_tokens: 4096}")), "max_tokens")
)
case("config: a cycle")(lambda c: (str(_graph(c, "[a]", extra="[request, b]")), "a → b → a"))
case("config: a stage nothing reaches")(
    lambda c: (str(_graph(c, "[]")), "no path from the request reaches b")
)
case("config: an output that goes nowhere")(
    lambda c: (str(_graph(c, "[a]", final="false")), "stages.b", "goes nowhere")
)
case("config: several inputs without a join")(
    lambda c: (str(_graph(c, "[request, a]")), "stages.b.join", "no join")
)
case("config: a join of one input")(
    lambda c: (str(_graph(c, "[a], join: latest")), "stages.b.join", "join: latest")
)
case("config: final_output_type the stage does not produce")(
    lambda c: (
        str(c.stage(", final_output_type: audio")),
        "final_output_type",
        "produces text, not audio",
    )
)
case("config: a stage name of 10,000 characters")(
    lambda c: (
        *_cfg(c, c.cfg.read_text().replace("{name: thinker", "{name: " + "t" * 10_000)),
        "stages[0].name",
        "(10000 characters) is not a usable stage name",
        "at most 64 characters",
    )
)
case("config: a stage name of 65 characters")(
    lambda c: (
        *_cfg(c, c.cfg.read_text().replace("{name: thinker", "{name: " + "t" * 65)),
        "stages[0].name",
        "at most 64 characters",
    )
)
case("config: a device listed twice")(
    lambda c: (
        *_cfg(c, c.cfg.read_text().replace("devices: [cpu]", "devices: [cpu, cpu]")),
        "stages[0].devices",
        "cpu is listed more than once (cpu, cpu)",
        "list each device once",
    )
)
case("config: a backend listed twice")(
    lambda c: (
        str(c.stage(", backends: [vllm-cpu, vllm-cpu]")),
        "stages[0].backends",
        "vllm-cpu is listed more than once",
        "list each backend once",
    )
)
case("config: a precision listed twice")(
    lambda c: (
        *_cfg(
            c,
            "name: bad-inputs\nstages:\n  - {name: voice, kind: exported_graph, artifact: x, devices: [cpu], precision: [fp32, fp32], final_output: true}\n",
        ),
        "stages[0].precision",
        "fp32 is listed more than once",
    )
)
case("config: text into a stage that takes audio")(
    lambda c: (
        str(_typed_edge(c)),
        "stages.voice.inputs",
        "thinker (ar_decode) produces text",
        "consumes audio@16000",
    )
)


def _graph(c: Case, b_inputs: str, *, final: str = "true", extra: str = "[request]") -> Path:
    """Two decoder stages a and b on the good checkpoint; b's inputs (and a's) as given."""
    row = f"kind: ar_decode, model: '{c.ckpt}', devices: [cpu], max_model_len: 1024"
    return c.config(
        "name: bad-inputs\nstages:\n"
        f"  - {{name: a, {row}, inputs: {extra}, final_output: true{', join: all' if ',' in extra else ''}}}\n"
        f"  - {{name: b, {row}, inputs: {b_inputs}, final_output: {final}}}\n"
    )


def _typed_edge(c: Case) -> Path:
    """The thinker feeding an exported stage whose manifest takes audio at 16 kHz only."""
    art = c.manifest(MANIFEST_OK + "consumes: ['audio@16000']\n", {"model.onnx": b""}).parent
    return c.config(
        c.stage().read_text()
        + f"  - {{name: voice, kind: exported_graph, artifact: {art}, devices: [cpu], inputs: [thinker]}}\n"
    )


def _non_utf8(c: Case) -> str:
    c.cfg = c.tmp / "latin1.yaml"
    c.cfg.write_bytes(b"name: caf\xe9\nstages: []\n")
    return str(c.cfg)


# -- the hardware profile (--profile) --
case("profile: a directory")(
    lambda c: (str(setattr(c, "prof", _dir(c, "prof.json")) or c.prof), "directory")
)
case("profile: not UTF-8")(lambda c: (str(c.profile(raw=b'{"name": "caf\xe9"}')), "UTF-8"))
case("profile: unreadable")(
    lambda c: (str(setattr(c, "prof", Path("/proc/self/mem")) or c.prof), "cannot read")
)
case("profile: not JSON")(lambda c: (str(c.profile(raw=b"host: linux\n")), "JSON"))
case("profile: nested too deep")(lambda c: (str(c.profile(raw=_deep(100_000))), "nested"))
case("profile: a JSON list")(lambda c: (str(c.profile([PROFILE])),))
case("profile: another format")(
    lambda c: (str(c.profile({**PROFILE, "format": "omni-edge.profile/9"})), "format")
)
case("profile: 10^40 bytes of RAM")(
    lambda c: (str(c.host(ram_available_bytes=10**40)), "host.ram_available_bytes")
)
case("profile: 10^40 bytes of RAM in total")(
    lambda c: (str(c.host(ram_total_bytes=10**40)), "host.ram_total_bytes")
)
case("profile: negative RAM")(
    lambda c: (str(c.host(ram_available_bytes=-1)), "host.ram_available_bytes")
)
case("profile: RAM as text")(
    lambda c: (str(c.host(ram_available_bytes="lots")), "host.ram_available_bytes")
)
case("profile: a device id that is no id")(
    lambda c: (
        str(c.profile({**PROFILE, "devices": [{**PROFILE["devices"][0], "id": "cpu0"}]})),
        "devices[0].id",
    )
)
case("profile: a GPU without memory")(
    lambda c: (
        str(
            c.profile(
                {
                    **PROFILE,
                    "devices": [
                        *PROFILE["devices"],
                        {"id": "gpu:0", "kind": "gpu", "name": "g", "backends": ["vllm-cuda"]},
                    ],
                }
            )
        ),
        "memory_bytes",
    )
)
case("profile: a GPU with 10^40 bytes")(
    lambda c: (
        str(
            c.profile(
                {
                    **PROFILE,
                    "devices": [
                        *PROFILE["devices"],
                        {
                            "id": "gpu:0",
                            "kind": "gpu",
                            "name": "g",
                            "memory_bytes": 10**40,
                            "backends": ["vllm-cuda"],
                        },
                    ],
                }
            )
        ),
        "devices[1].memory_bytes",
    )
)
case("profile: a route nobody defined")(
    lambda c: (
        str(c.profile({**PROFILE, "devices": [{**PROFILE["devices"][0], "route": "ghost"}]})),
        "ghost",
    )
)
case("profile: 4x more RAM available than in total")(
    lambda c: (
        str(c.host(ram_available_bytes=4 * PROFILE["host"]["ram_total_bytes"])),
        ": host",
        "ram_available_bytes (128.00 GiB) is more than ram_total_bytes (32.00 GiB)",
        "at most ram_total_bytes",
    )
)
case("profile: a device name with an escape sequence")(
    lambda c: (
        str(
            c.profile(
                {**PROFILE, "devices": [{**PROFILE["devices"][0], "name": "cpu\x1b]52;c;aGk=\x07"}]}
            )
        ),
        "devices[0].name",
        "holds a control character",
        "remove the control characters",
    )
)
case("profile: a machine name of 10,000 characters")(
    lambda c: (
        str(c.profile({**PROFILE, "name": "m" * 10_000})),
        ": name",
        "is longer than 200 characters",
    )
)
case("profile: an unknown host key")(lambda c: (str(c.host(ram_speed=6400)), "ram_speed"))

# -- the checkpoint's config.json --
case("config.json: a JSON list")(lambda c: (str(c.model_config([llama_config()])), "JSON object"))
case("config.json: a JSON string")(lambda c: (str(c.model_config("llama")), "JSON object"))
case("config.json: not UTF-8")(
    lambda c: (str(c.model_config(raw=b'{"model_type": "caf\xe9"}')), "UTF-8")
)
case("config.json: not JSON")(lambda c: (str(c.model_config(raw=b"{model_type: llama")), "JSON"))
case("config.json: nested too deep")(
    lambda c: (str(c.model_config(raw=_deep(100_000))), "config.json")
)
case("config.json: a directory")(
    lambda c: (
        (c.ckpt / "config.json").unlink(),
        _dir(c, "m/config.json"),
        str(c.ckpt / "config.json"),
    )[2:]
)
case("config.json: negative layer count")(lambda c: (str(c.text(layers=-2)), "num_hidden_layers"))
case("config.json: zero layers")(lambda c: (str(c.text(layers=0)), "num_hidden_layers"))
case("config.json: layers as text")(lambda c: (str(c.text(layers="two")), "num_hidden_layers"))
case("config.json: 10^30 layers")(lambda c: (str(c.text(layers=10**30)), "num_hidden_layers"))
case("config.json: layers true")(lambda c: (str(c.text(layers=True)), "num_hidden_layers"))
case("config.json: negative hidden size")(lambda c: (str(c.text(hidden=-64)), "hidden_size"))
case("config.json: no attention heads")(
    lambda c: (
        str(
            c.model_config({k: v for k, v in llama_config().items() if k != "num_attention_heads"})
        ),
        "num_attention_heads",
    )
)
case("config.json: negative KV heads")(lambda c: (str(c.text(kv_heads=-2)), "num_key_value_heads"))
case("config.json: negative head_dim")(lambda c: (str(c.text(head_dim=-8)), "head_dim"))
case("config.json: negative context")(
    lambda c: (str(c.text(max_position_embeddings=-1)), "max_position_embeddings")
)
case("config.json: a float sliding window")(
    lambda c: (str(c.text(sliding_window=1.5, use_sliding_window=True)), "sliding_window")
)
case("config.json: thinker_config a list")(
    lambda c: (
        (str(c.model_config({**llama_config(), "thinker_config": [1]})),)
        if False
        else _thinker_list(c)
    )
)

# -- safetensors headers --
case("safetensors: an entry without data_offsets")(
    lambda c: (str(c.entry(data_offsets=None)), "data_offsets")
)
case("safetensors: an entry without dtype")(lambda c: (str(c.entry(dtype=None)), "dtype"))
case("safetensors: an entry without shape")(lambda c: (str(c.entry(shape=None)), "shape"))
case("safetensors: negative offsets")(
    lambda c: (str(c.entry(data_offsets=[-8192, 0])), "data_offsets")
)
case("safetensors: offsets reversed")(
    lambda c: (str(c.entry(data_offsets=[8192, 0])), "data_offsets")
)
case("safetensors: offsets as text")(
    lambda c: (str(c.entry(data_offsets=["0", "8192"])), "data_offsets")
)
case("safetensors: offsets that disagree with the shape")(
    lambda c: (str(c.entry(data_offsets=[0, 10**15])), "data_offsets")
)
case("safetensors: a negative dimension")(lambda c: (str(c.entry(shape=[-64, -64])), "shape"))
case("safetensors: dtype a number")(lambda c: (str(c.entry(dtype=2)), "dtype"))
case("safetensors: an entry that is a list")(
    lambda c: (str(c.weights(safetensors({"w": [0, 1]}))), "'w'")
)
case("safetensors: header a list")(lambda c: (str(c.weights(safetensors([1, 2]))), "JSON object"))
case("safetensors: header not JSON")(
    lambda c: (str(c.weights(safetensors(None, raw=b"{not json"))), "safetensors")
)
case("safetensors: header not UTF-8")(
    lambda c: (str(c.weights(safetensors(None, raw=b'{"\xff": 1}'))), "safetensors")
)
case("safetensors: header length 2^63")(
    lambda c: (str(c.weights(safetensors({}, length=2**63))), "implausible")
)
case("safetensors: header longer than the file")(
    lambda c: (str(c.weights(safetensors({}, length=4096))), "safetensors")
)
case("safetensors: shorter than 8 bytes")(lambda c: (str(c.weights(b"\x01\x02")), "8-byte"))
case("safetensors: nested too deep")(
    lambda c: (str(c.weights(safetensors(None, raw=_deep(100_000)))), "safetensors")
)
case("index: negative total_size")(
    lambda c: (str(c.index({"metadata": {"total_size": -1}, "weight_map": {}})), "total_size")
)
case("index: total_size as text")(
    lambda c: (str(c.index({"metadata": {"total_size": "big"}, "weight_map": {}})), "total_size")
)
case("index: weight_map a list")(
    lambda c: (
        str(c.index({"metadata": {"total_size": 1}, "weight_map": [["a", "b"]]})),
        "weight_map",
    )
)
case("index: weight_map of lists")(
    lambda c: (
        str(c.index({"metadata": {"total_size": 1}, "weight_map": {"a": ["x"]}})),
        "weight_map",
    )
)
case("index: metadata a list")(
    lambda c: (str(c.index({"metadata": [1], "weight_map": {}})), "index")
)

# -- GGUF headers --
case("gguf: no magic")(lambda c: (str(c.gguf(b"GGML" + gguf()[4:])), "GGUF"))
case("gguf: empty file")(lambda c: (str(c.gguf(b"")), "GGUF"))
case("gguf: truncated header")(lambda c: (str(c.gguf(gguf()[:40])), "GGUF"))
case("gguf: more keys than the file holds")(lambda c: (str(c.gguf(gguf(n_kv=2**40))), "GGUF"))
case("gguf: an unknown value type")(
    lambda c: (str(c.gguf(gguf()[:24] + _gstr("k") + struct.pack("<I", 99) + b"\0" * 16)), "GGUF")
)
case("gguf: negative block count")(
    lambda c: (str(c.gguf(gguf(_llama_meta(llama__block_count=(I32, -4))))), "num_hidden_layers")
)
case("gguf: block count as text")(
    lambda c: (
        str(c.gguf(gguf(_llama_meta(llama__block_count=(STRING, "four"))))),
        "num_hidden_layers",
    )
)
case("gguf: hidden size as a float")(
    lambda c: (str(c.gguf(gguf(_llama_meta(llama__embedding_length=(F32, 64.0))))), "hidden_size")
)
case("gguf: negative context length")(
    lambda c: (
        str(c.gguf(gguf(_llama_meta(llama__context_length=(I32, -1))))),
        "max_position_embeddings",
    )
)
case("gguf: no head count")(
    lambda c: (
        str(c.gguf(gguf([m for m in _llama_meta() if m[0] != "llama.attention.head_count"]))),
        "num_attention_heads",
    )
)

# -- exported artifacts: manifests and ONNX files --
case("manifest: not a mapping")(lambda c: (str(c.manifest("- 1\n")),))
case("manifest: YAML syntax")(lambda c: (str(c.manifest("format: [\n")), "YAML"))
case("manifest: unknown key")(
    lambda c: (str(c.manifest(MANIFEST_OK + "colour: red\n", {"model.onnx": b""})), "colour")
)
case("manifest: another format")(
    lambda c: (
        str(c.manifest(MANIFEST_OK.replace("export/1", "export/7"), {"model.onnx": b""})),
        "format",
    )
)
case("manifest: a graph outside the directory")(
    lambda c: (
        str(c.manifest(MANIFEST_OK.replace("model.onnx", "../../etc/passwd"))),
        "precisions.fp32",
    )
)
case("manifest: a payload type misspelt")(
    lambda c: (
        str(c.manifest(MANIFEST_OK + "produces: ['audio@22kHz']\n", {"model.onnx": b""})),
        "produces",
        "audio@22kHz",
    )
)
case("manifest: a graph that does not exist")(
    lambda c: (str(c.manifest(MANIFEST_OK)), "precisions.fp32")
)
case("manifest: not UTF-8")(lambda c: (_manifest_bytes(c, b"name: caf\xe9\n"), "UTF-8"))
case("onnx: a graph that is not ONNX")(
    lambda c: (
        str(
            c.manifest(MANIFEST_OK, {"model.onnx": b"\x08\x07garbage\xff\xff"}).parent
            / "model.onnx"
        ),
    )
)
case("onnx: an empty graph file")(
    lambda c: (str(c.manifest(MANIFEST_OK, {"model.onnx": b""}).parent / "model.onnx"),)
)


def _thinker_list(c: Case) -> tuple[str, ...]:
    path = c.model_config({**llama_config(), "thinker_config": [1], "text_config": "x"})
    c.stage(", model_stage: thinker")
    return (str(path.parent), "thinker")


def _manifest_bytes(c: Case, data: bytes) -> str:
    path = c.manifest(MANIFEST_OK)
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_refused_at_the_door(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    c = Case(tmp_path)
    mentions = CASES[name](c)
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "plan.json"
    refused(
        capsys,
        ["plan", str(c.cfg), "--profile", str(c.prof), "--out", str(out)],
        *mentions,
        out=out,
    )
    assert list((tmp_path / "out").iterdir()) == []


def test_the_corpus_is_large() -> None:
    assert len(CASES) >= 60


# ---- --mask must name a device of the profile ------------------------------------


@pytest.mark.parametrize("mask", ["npu:7", "foo", "cpu,gpu:3", "CPU"])
def test_a_mask_that_names_no_device_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mask: str
) -> None:
    cfg, prof = good_inputs(tmp_path)
    out = tmp_path / "plan.json"
    bad = next(m for m in mask.split(",") if m != "cpu")
    err = refused(
        capsys,
        ["plan", str(cfg), "--profile", str(prof), "--mask", mask, "--out", str(out)],
        f"--mask {bad}",
        "it has cpu",
        out=out,
    )
    assert "names no device" in err


def test_a_mask_of_a_device_or_a_kind_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, prof = good_inputs(tmp_path)
    assert main(["plan", str(cfg), "--profile", str(prof), "--mask", "npu", "--json"]) == 0
    assert main(["plan", str(cfg), "--profile", str(prof), "--mask", "cpu", "--json"]) == 3


# ---- a few through a real process: the exit code and stderr a shell sees ---------


@pytest.mark.parametrize(
    "name",
    [
        "profile: a directory",
        "config.json: a JSON list",
        "safetensors: an entry without data_offsets",
        "config: name with ../",
        "gguf: negative block count",
    ],
)
def test_bad_input_in_a_real_process_exits_2_without_a_traceback(tmp_path: Path, name: str) -> None:
    import os
    import subprocess
    import sys

    from tests.helpers import REPO

    c = Case(tmp_path)
    mentions = CASES[name](c)
    out = tmp_path / "plan.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "plan",
            str(c.cfg),
            "--profile",
            str(c.prof),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "OMNI_EDGE_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr + run.stdout and run.stdout == ""
    assert "how to fix:" in run.stderr and all(m in run.stderr for m in mentions)
    assert not out.exists()


@pytest.mark.parametrize("command", [["verify"], ["run", "--prompt", "hi"]])
@pytest.mark.parametrize(
    "name",
    ["profile: not UTF-8", "config.json: negative layer count", "config: name of 300 characters"],
)
def test_verify_and_run_refuse_the_same_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], name: str
) -> None:
    c = Case(tmp_path)
    mentions = CASES[name](c)
    refused(capsys, [command[0], str(c.cfg), "--profile", str(c.prof), *command[1:]], *mentions)


@pytest.mark.parametrize("which", ["config", "profile"])
def test_plan_out_onto_its_own_input_is_refused_and_the_input_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    cfg, prof = good_inputs(tmp_path)
    target = cfg if which == "config" else prof
    before = target.read_bytes()
    refused(
        capsys,
        ["plan", str(cfg), "--profile", str(prof), "--out", str(target)],
        "--out",
        "would replace it",
    )
    assert target.read_bytes() == before


def test_a_file_with_thousands_of_problems_gets_a_bounded_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, prof = good_inputs(tmp_path)
    cfg.write_text("name: many\nstages:\n" + "".join(f"  - stage{i}\n" for i in range(5000)))
    err = refused(
        capsys, ["plan", str(cfg), "--profile", str(prof)], "stages[0]", "… and 4980 more problems"
    )
    assert len(err.splitlines()) <= 45


# ---- numbers on the command line: caught before any slow work ----------------------


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf"])
def test_probe_timeout_that_is_no_positive_number_is_refused_before_probing(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    value: str,
) -> None:
    import orchestrator.probe as probe

    def no_probe(*a: object, **k: object) -> None:
        raise AssertionError("probed with a bad --timeout")

    monkeypatch.setattr(probe, "probe_profile", no_probe)
    err = refused(
        capsys,
        ["probe", "--timeout", value],
        "--timeout",
        "how to fix: give the seconds each interpreter may take",
    )
    assert (
        "is not a finite number" if value in ("nan", "inf") else f"{value} is not above 0"
    ) in err


@pytest.mark.parametrize("value", ["inf", "-inf"])
def test_run_temperature_that_is_not_finite_is_refused_before_planning(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    value: str,
) -> None:
    cfg, prof = good_inputs(tmp_path)
    cfg.write_text(
        cfg.read_text().replace(
            "final_output: true", "final_output: true, sampling: {max_tokens: 8}"
        )
    )
    refused(
        capsys,
        ["run", str(cfg), "--profile", str(prof), "--prompt", "hi", f"--temperature={value}"],
        "--temperature",
        "is not a finite number",
        "0.7",
    )


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_chat_url_temperature_that_is_not_finite_is_refused_before_connecting(
    capsys: pytest.CaptureFixture[str],
    value: str,
) -> None:
    # (it would go as Infinity or NaN, which is not JSON; a finite value out of range is
    # the server's to refuse, against its config). Port 9 (discard) on loopback:
    # nothing is contacted, the flag is refused first.
    refused(
        capsys,
        ["chat", "--url", "http://127.0.0.1:9", f"--temperature={value}"],
        "--temperature",
        f"{value} is not a finite number",
    )


@pytest.mark.parametrize("opset", ["0", "-5", "99"])
def test_export_opset_out_of_range_is_refused_before_the_model_is_loaded(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    opset: str,
) -> None:
    # the factory does not exist: naming the opset (not the factory) shows it was checked first
    refused(
        capsys,
        [
            "export",
            "--from",
            "torch",
            "no_such_module:factory",
            "-o",
            str(tmp_path / "art"),
            "--opset",
            opset,
        ],
        "--opset",
        f"opset {opset} is not supported here",
    )
    assert not (tmp_path / "art").exists()
