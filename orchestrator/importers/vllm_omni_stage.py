"""One upstream stage entry converted into an omni-edge stage (StageEntry: its model, devices, engine args, replicas, batch and context, sampling, inputs and final output), and vLLM-Omni's async_chunk hand-over read as joins and chunk sizes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config import sources
from orchestrator.core.errors import ConfigError, Problem
from orchestrator.importers.vllm_omni_read import context_limit, devices_of
from orchestrator.importers.vllm_omni_report import DEFAULT_MAX_MODEL_LEN, ImportReport
from orchestrator.importers.vllm_omni_schema import (
    DTYPES,
    ENGINE_KEYS,
    SAMPLING_KEYS,
    Topology,
    TopologyStage,
)
from stages.base import MAX_REPLICAS
from stages.payloads import split_input
from stages.registry import get_kind


def stage_topology(
    entries: list[dict[str, Any]], topo: Topology, list_key: str, where: str
) -> dict[Any, TopologyStage]:
    """Each entry's stage of ``topo`` by its stage_id; ``ConfigError`` listing every entry
    that is malformed, is no stage of the topology, or repeats a stage_id."""
    problems: list[Problem] = []
    by_id: dict[Any, TopologyStage] = {}
    for i, s in enumerate(entries):
        loc = f"{list_key}[{i}]"
        sid = s.get("stage_id", i)
        if isinstance(sid, bool) or not isinstance(sid, (int, str)):
            problems.append(
                Problem(
                    f"{where}: {loc}.stage_id",
                    f"must be a whole number, got {sid!r}"[:200],
                    "write stage_id: 0",
                )
            )
            continue
        for key in ("engine_args", "runtime", "default_sampling_params"):
            if key in s and not isinstance(s[key], (dict, type(None))):
                problems.append(
                    Problem(
                        f"{where}: {loc}.{key}",
                        f"must be a mapping, got a {type(s[key]).__name__}",
                        f"write {key}: as key: value lines",
                    )
                )
        sources = s.get("engine_input_source")
        if sources is not None and not (
            isinstance(sources, list)
            and all(isinstance(x, int) and not isinstance(x, bool) for x in sources)
        ):
            problems.append(
                Problem(
                    f"{where}: {loc}.engine_input_source",
                    f"must be a list of stage ids, got {sources!r}"[:200],
                    "write engine_input_source: [0]",
                )
            )
        engine = s.get("engine_args") if isinstance(s.get("engine_args"), dict) else {}
        model_stage = (engine or {}).get("model_stage") or s.get("model_stage")
        ts = (
            topo.by_model_stage(str(model_stage))
            if model_stage
            else topo.by_id(s.get("stage_id", -1))
        )
        if ts is None:
            what = f"model_stage {model_stage!r}" if model_stage else f"stage_id {sid!r}"
            problems.append(
                Problem(
                    f"{where}: {loc}",
                    f"{what} is no stage of the {topo.name} topology",
                    f"use the topology's stages: {', '.join(f'{t.stage_id} {t.model_stage}' for t in topo.stages)}",
                )
            )
            continue
        if sid in by_id:
            problems.append(
                Problem(
                    f"{where}: {loc}.stage_id",
                    f"stage_id {sid} is used more than once",
                    "give each stage its own stage_id",
                )
            )
        by_id[sid] = ts
    if problems:
        raise ConfigError(problems)
    return by_id


def _connector_extra(
    data: dict[str, Any], entries: list[dict[str, Any]], src_id: int, dst_id: int
) -> tuple[str, dict[str, Any]] | None:
    """``(name, extra)`` of the connector on the edge ``src_id → dst_id``: the receiving stage's
    ``input_connectors.from_stage_<src>``, else the sender's ``output_connectors.to_stage_<dst>``."""
    found = data.get("connectors")
    connectors: dict[str, Any] = found if isinstance(found, dict) else {}
    for sid, side, key in (
        (dst_id, "input_connectors", f"from_stage_{src_id}"),
        (src_id, "output_connectors", f"to_stage_{dst_id}"),
    ):
        entry = next((e for e in entries if e.get("stage_id") == sid), None)
        ref = (
            ((entry or {}).get(side) or {}).get(key)
            if isinstance((entry or {}).get(side), dict)
            else None
        )
        conn = connectors.get(ref) if isinstance(ref, str) else None
        if isinstance(conn, dict):
            extra = conn.get("extra")
            return str(ref), (extra if isinstance(extra, dict) else {})
    return None


CHUNK_KEYS = (
    ("codec_chunk_frames", "frames", 25),
    ("codec_left_context_frames", "left_context", 25),
    ("initial_codec_chunk_frames", "first_frames", 0),
)
"""vLLM-Omni's async-chunk connector extras → the exported_graph kind's ``chunk:`` fields, with
upstream's defaults when the file gives none (``talker2code2wav_async_chunk`` in
``vllm_omni/model_executor/stage_input_processors/qwen3_omni.py``: 25, 25, and no smaller
first chunk)."""


def async_chunk(
    data: dict[str, Any],
    shape: str,
    topo: Topology,
    stages: list[dict[str, Any]],
    entries: list[dict[str, Any]],
    report: ImportReport,
) -> set[str]:
    """vLLM-Omni's ``async_chunk`` (a deploy file's; true when absent, as its ``DeployConfig``
    has it): the talker starting on the thinker's first chunk, code2wav decoding the talker's
    codes in windows. Returns the connector extras it mapped."""
    value = data.get("async_chunk", True)
    given = "async_chunk" in data
    by_name = {s["name"]: s for s in stages}
    talker, code2wav = by_name.get("talker"), by_name.get("code2wav")
    if not isinstance(value, bool):
        report.foreign(
            "async_chunk", f"{value!r} is not true or false; read as vLLM-Omni's default, true"
        )
        value = True
    if talker is None and code2wav is None:
        if given:
            report.foreign(
                "async_chunk",
                "a one-stage pipeline: nothing streams between stages (vLLM-Omni turns it off too)",
            )
        return set()
    said = f"async_chunk: {str(value).lower()}" + (
        "" if given else " (absent: vLLM-Omni's default)"
    )
    if talker is not None and len(talker.get("inputs", [])) > 1:
        _talker_join(talker, value, said, topo, report)
    if code2wav is not None:
        return _code2wav_chunk(code2wav, value, said, data, topo, entries, report)
    return set()


def _talker_join(
    talker: dict[str, Any], value: bool, said: str, topo: Topology, report: ImportReport
) -> None:
    """The talker's ``join`` over its several inputs: ``latest`` (it starts on the thinker's
    first steps) where ``async_chunk`` is on and the topology's talker streams, else ``all``."""
    if value and topo.streaming_talker:
        talker["join"] = "latest"
        report.notes[:] = [n for n in report.notes if not n.startswith("stages.talker.join: all")]
        report.map("async_chunk", "stages.talker.join", "latest")
        report.notes.append(
            f"stages.talker.join: latest ({said}): the talker starts on the thinker's first steps "
            "and gives the same codes as with its whole hand-over (docs/omni.md, streaming); "
            "vLLM-Omni itself refuses async_chunk for this pipeline (it has no async producer)"
        )
    elif value:
        report.notes.append(
            f"stages.talker.join: all ({said}): this model's talker takes the thinker's whole "
            "hand-over here (it refuses join: latest: docs/omni.md), so only code2wav streams"
        )
    else:
        report.map("async_chunk", "stages.talker.join", "all")


def _code2wav_chunk(
    code2wav: dict[str, Any],
    value: bool,
    said: str,
    data: dict[str, Any],
    topo: Topology,
    entries: list[dict[str, Any]],
    report: ImportReport,
) -> set[str]:
    """code2wav's ``chunk:``: windows of the talker's codes where ``async_chunk`` is on and
    the topology's code2wav decodes in chunks, the whole sequence at once where it is off.
    Returns the connector extras it mapped."""
    if not topo.chunked_code2wav:
        if value:
            report.notes.append(
                f"stages.code2wav ({said}): no chunk: this model's code2wav has no chunked "
                "decode here (docs/omni.md, code2wav)"
            )
        return set()
    if not value:
        code2wav["chunk"] = {"frames": None}
        report.map("async_chunk", "stages.code2wav.chunk", {"frames": None})
        report.notes.append(
            f"stages.code2wav.chunk: frames null ({said}): the talker's whole code sequence "
            "in one call once it has ended (vLLM-Omni's talker2code2wav_full_payload)"
        )
        return set()
    edge = _connector_extra(data, entries, 1, 2)
    chunk, used = _chunk_fields(edge, report)
    code2wav["chunk"] = chunk
    report.map("async_chunk", "stages.code2wav.chunk", chunk)
    report.notes.append(
        f"stages.code2wav.chunk: {chunk} ({said}): the talker's codes decoded in windows "
        "with left context as they come, so audio starts before the talker ends"
        + (
            ""
            if edge
            else "; the file names no connector on the talker → code2wav edge, so "
            "vLLM-Omni's defaults"
        )
    )
    report.notes.append(
        f"stages.code2wav.artifact: {code2wav.get('artifact')} is where the checkpoint's "
        "code2wav, exported with metadata.samples_per_frame, goes (docs/export.md, "
        "Qwen3-Omni's code2wav); a manifest marked not_exported there is refused by name "
        "(no_exported_graph)"
    )
    return used


def _chunk_fields(
    edge: tuple[str, dict[str, Any]] | None, report: ImportReport
) -> tuple[dict[str, Any], set[str]]:
    """The ``chunk:`` fields from the talker → code2wav connector's extras (``CHUNK_KEYS``,
    upstream's defaults where absent or not an integer), and the extras it mapped."""
    extra = edge[1] if edge else {}
    chunk: dict[str, Any] = {}
    used: set[str] = set()
    for up, mine, default in CHUNK_KEYS:
        v = extra.get(up, default)
        if edge and up in extra:
            used.add(f"connectors.{edge[0]}.extra.{up}")
            report.map(f"connectors.{edge[0]}.extra.{up}", f"stages.code2wav.chunk.{mine}", v)
        chunk[mine] = int(v) if isinstance(v, int) and not isinstance(v, bool) else default
    return chunk, used


@dataclass(frozen=True)
class StageContext:
    """What every stage of one import shares."""

    topo: Topology
    by_id: dict[Any, TopologyStage]
    """The file's stage ids → their stage of the topology (``stage_topology``)."""
    report: ImportReport
    model_ref: str
    """The stages' ``model:`` (relative to the written config, or ``MODEL_DIR``)."""
    model_cfg: dict[str, Any] | None
    shape: str
    model_dir: Path | None


_DEPLOY_NOT_ENGINE = (
    "stage_id",
    "stage_type",
    "devices",
    "default_sampling_params",
    "engine_input_source",
    "final_output",
    "final_output_type",
    "max_num_seqs",
)
"""A deploy stage's flat keys that are not engine settings (the rest are ``engine_args``)."""


_STAGE_KEYS = (
    "stage_id",
    "stage_type",
    "engine_args",
    "runtime",
    "default_sampling_params",
    "engine_input_source",
    "final_output",
    "final_output_type",
    "model_stage",
)
"""A legacy stage entry's keys that a method of :class:`StageEntry` reads."""


class StageEntry:
    """One stage entry of a vLLM-Omni file becoming an omni-edge stage (:meth:`convert`): a
    method for each part of the entry — :meth:`model`, :meth:`devices`, :meth:`engine`,
    :meth:`sampling`, :meth:`inputs`, :meth:`final` — each writing its fields into ``out``
    and what it mapped, or found no equivalent for, into the report, in that order."""

    def __init__(
        self, entry: dict[str, Any], loc: str, ts: TopologyStage, ctx: StageContext
    ) -> None:
        self.s, self.loc, self.ts, self.ctx = entry, loc, ts, ctx
        self.report = ctx.report
        self.name = ts.model_stage
        self.out: dict[str, Any] = {"name": self.name, "kind": ts.kind}
        self.deploy = ctx.shape == "deploy"
        self.flat = {k: v for k, v in entry.items() if k not in ("engine_args", "runtime")}
        self.engine_args: dict[str, Any]
        self.runtime: dict[str, Any]
        if self.deploy:  # engine fields flat on the stage
            self.engine_args = {k: v for k, v in self.flat.items() if k not in _DEPLOY_NOT_ENGINE}
            self.runtime = {k: self.flat[k] for k in ("devices", "max_num_seqs") if k in self.flat}
        else:
            self.engine_args = dict(entry.get("engine_args") or {})
            self.runtime = dict(entry.get("runtime") or {})
        self.eloc = loc if self.deploy else f"{loc}.engine_args"
        self.rloc = loc if self.deploy else f"{loc}.runtime"

    def convert(self) -> dict[str, Any]:
        sid = self.s.get("stage_id")
        if isinstance(sid, int) and not isinstance(sid, bool):
            self.out["stage_id"] = sid
            self.report.map(f"{self.loc}.stage_id", f"stages.{self.name}.stage_id", sid)
        ts = self.ts
        self.report.stages.append(
            {
                "stage_id": sid,
                "name": self.name,
                "kind": ts.kind,
                "model_stage": ts.model_stage,
                "inputs": list(ts.inputs),
                "carries": ts.carries,
            }
        )
        self.model()
        devices = self.devices()
        self.engine()
        self.sampling()
        self.inputs()
        self.out["devices"] = devices
        self.final()
        return _ordered(self.out)

    def model(self) -> None:
        """``kind``, and ``model`` and ``model_stage`` (a generation stage) or ``artifact`` (an
        exported graph), from the topology."""
        ts, name, out, report = self.ts, self.name, self.out, self.report
        stage_type = self.s.get("stage_type")
        if stage_type is not None:
            report.map(
                f"{self.loc}.stage_type",
                f"stages.{name}.kind",
                f"{stage_type} → {ts.kind} ({ts.model_stage} in {self.ctx.topo.name})",
            )
        if ts.kind == "ar_decode":
            out["model"] = self.ctx.model_ref
            out["model_stage"] = ts.model_stage
        else:
            out["artifact"] = f"{self.ctx.model_ref}/{ts.model_stage}"
            model_dir = self.ctx.model_dir
            if model_dir is not None and (model_dir / ts.model_stage / "manifest.yaml").is_file():
                report.notes.append(
                    f"stages.{name}: {ts.model_stage} runs as an exported graph, artifact {out['artifact']}"
                )
            else:
                report.notes.append(
                    f"stages.{name}: {ts.model_stage} runs as an exported graph; artifact {out['artifact']} "
                    "must hold its manifest (docs/exported-artifacts.md)"
                )
        if "model_stage" in self.engine_args:
            report.map(
                f"{self.eloc}.model_stage",
                f"stages.{name}.model_stage"
                if ts.kind == "ar_decode"
                else f"stages.{name}.artifact",
                self.engine_args["model_stage"],
            )

    def devices(self) -> list[str]:
        """vLLM-Omni's ``devices: "0,1"`` (CUDA indices) as ``gpu:N`` candidates; gpu:0 when
        the file names none or names them some other way."""
        runtime, name, report = self.runtime, self.name, self.report
        devices = devices_of(runtime.get("devices")) if "devices" in runtime else None
        if devices is None:
            if "devices" in runtime:
                report.foreign(
                    f"{self.rloc}.devices",
                    f'{runtime["devices"]!r} is not a list of GPU indices ("0", "0,1"); gpu:0 assumed',
                )
            else:
                report.notes.append(
                    f"stages.{name}.devices: the file names no devices; gpu:0 assumed"
                )
            return ["gpu:0"]
        report.map(f"{self.rloc}.devices", f"stages.{name}.devices", devices)
        replicas = (self.flat if self.deploy else runtime).get("num_replicas")
        if len(devices) > 1:
            report.notes.append(
                f"stages.{name}.devices: {runtime['devices']!r} lists {len(devices)} GPUs; here they are "
                + (
                    f"candidates in preference order and its {replicas} replicas are spread over them "
                    "(one a GPU while there are enough)"
                    if isinstance(replicas, int) and not isinstance(replicas, bool) and replicas > 1
                    else "candidates in preference order and the stage is placed on one of them"
                )
            )
        return devices

    def engine(self) -> None:
        """The engine's settings (``engine_args``, a deploy stage's flat fields, ``runtime``):
        a generation stage's batch and context, every other key listed with why."""
        ts, name, out, report, runtime = self.ts, self.name, self.out, self.report, self.runtime
        generates = ts.kind == "ar_decode"
        if generates:
            self._batch_and_context()
        self._replicas()
        for k, v in self.engine_args.items():
            key = f"{self.eloc}.{k}"
            if k == "model_stage" or (k == "num_replicas" and self.deploy):
                continue
            if generates and k in ENGINE_KEYS and not (k == "dtype" and v not in DTYPES):
                out[ENGINE_KEYS[k]] = v
                report.map(key, f"stages.{name}.{ENGINE_KEYS[k]}", v)
            elif k == "enable_prefix_caching" and v is False:
                report.map(key, f"stages.{name} (always off here)", v)
            elif k in ("max_num_batched_tokens", "enforce_eager") and not generates:
                report.foreign(
                    key,
                    f"an engine setting of a generation engine; {ts.model_stage} runs as an exported graph here",
                )
            else:
                report.foreign(key)
        for k in runtime:
            if k in ("devices", "num_replicas") or (
                k in ("max_batch_size", "max_num_seqs") and generates
            ):
                continue
            report.foreign(
                f"{self.rloc}.{k}",
                f"{ts.model_stage} runs as an exported graph here, one item at a time"
                if k in ("max_batch_size", "max_num_seqs")
                else None,
            )

    def _replicas(self) -> None:
        """vLLM-Omni's ``num_replicas`` (a deploy stage's flat field, a legacy stage's
        ``runtime``) as the stage's ``replicas``: each instance placed and reserved on its
        own, spread over the stage's devices."""
        where = self.flat if self.deploy else self.runtime
        if "num_replicas" not in where:
            return
        n, key = where["num_replicas"], f"{self.rloc}.num_replicas"
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_REPLICAS:
            self.report.foreign(
                key, f"{n!r} is not a number of instances from 1 to {MAX_REPLICAS}; one is planned"
            )
        elif n == 1:
            self.report.map(key, f"stages.{self.name} (one instance, the default)", n)
        else:
            self.out["replicas"] = n
            self.report.map(key, f"stages.{self.name}.replicas", n)

    def _batch_and_context(self) -> None:
        """A generation stage's ``max_num_seqs`` (the file's batch size) and ``max_model_len``
        (the file's, else the model's own limit, else 32768)."""
        name, out, report, runtime = self.name, self.out, self.report, self.runtime
        seqs = runtime.get("max_batch_size", runtime.get("max_num_seqs"))
        if isinstance(seqs, int) and not isinstance(seqs, bool) and seqs >= 1:
            out["max_num_seqs"] = seqs
            key = "max_batch_size" if "max_batch_size" in runtime else "max_num_seqs"
            report.map(f"{self.rloc}.{key}", f"stages.{name}.max_num_seqs", seqs)
        if "max_model_len" in self.engine_args:
            return
        limit = context_limit(self.ctx.model_cfg, self.ts.model_stage)
        if limit is not None:
            out["max_model_len"] = limit
            report.notes.append(
                f"stages.{name}.max_model_len: {limit}, the model's own limit "
                "(vLLM-Omni leaves it to the engine, which takes the same)"
            )
        else:
            out["max_model_len"] = DEFAULT_MAX_MODEL_LEN
            report.notes.append(
                f"stages.{name}.max_model_len: {DEFAULT_MAX_MODEL_LEN} assumed "
                "(no --model to read the limit from)"
            )

    def sampling(self) -> None:
        """``default_sampling_params``: a generation stage's ``sampling``; nothing for code2wav."""
        sampling = self.s.get("default_sampling_params")
        if not isinstance(sampling, dict):
            return
        loc, name, report = self.loc, self.name, self.report
        if self.ts.kind != "ar_decode":
            report.foreign(
                f"{loc}.default_sampling_params",
                f"{self.ts.model_stage} does not sample (it turns codec "
                "codes into audio); the settings do nothing here",
            )
            return
        mapped = {k: sampling[k] for k in SAMPLING_KEYS if k in sampling}
        if mapped:
            self.out["sampling"] = mapped
        for k, v in sampling.items():
            if k in mapped:
                report.map(f"{loc}.default_sampling_params.{k}", f"stages.{name}.sampling.{k}", v)
            else:
                report.foreign(f"{loc}.default_sampling_params.{k}")
        _fit_max_tokens(self.out, name, report)

    def inputs(self) -> None:
        """``engine_input_source`` (stage ids) as ``inputs`` — a source the topology takes by its
        output ports as those ports — else the topology's; ``join: all`` for several."""
        ts, name, report, by_id, topo = (
            self.ts,
            self.name,
            self.report,
            self.ctx.by_id,
            self.ctx.topo,
        )
        src = self.s.get("engine_input_source")
        if src is not None:
            ids = src if isinstance(src, list) else [src]
            unknown = [x for x in ids if x not in by_id]
            if unknown:
                raise ConfigError.single(
                    f"{report.source}: {self.loc}.engine_input_source",
                    f"no stage has stage_id {unknown[0]}",
                    f"use one of {', '.join(str(k) for k in by_id)}",
                )
            names = [by_id[x].model_stage for x in ids]
            # a source the topology takes by its output ports (thinker2talker: hidden states and text) is those ports
            inputs = [
                p for n in names for p in ([i for i in ts.inputs if split_input(i)[0] == n] or [n])
            ] or ["request"]
            report.map(f"{self.loc}.engine_input_source", f"stages.{name}.inputs", inputs)
            if tuple(inputs) != ts.inputs:
                report.notes.append(
                    f"stages.{name}.inputs: the file says {inputs}, the {topo.name} topology "
                    f"{list(ts.inputs)}; the file's is kept"
                )
        else:
            inputs = list(ts.inputs)
            if inputs != ["request"]:
                report.notes.append(
                    f"stages.{name}.inputs: {inputs} from the {topo.name} topology ({ts.carries})"
                )
        self.out["inputs"] = inputs
        if len(inputs) > 1:
            self.out["join"] = "all"
            report.notes.append(
                f"stages.{name}.join: all (each input's whole output, once every input has ended)"
            )

    def final(self) -> None:
        """``final_output`` and its type: the file's, else (a deploy file) the topology's; the
        legacy entry's remaining keys listed as having no equivalent."""
        s, ts, name, out, report = self.s, self.ts, self.name, self.out, self.report
        if self.deploy and "final_output" not in s and ts.final_output_type is not None:
            out["final_output"] = True
            out["final_output_type"] = ts.final_output_type
            report.notes.append(
                f"stages.{name}.final_output: true, {ts.final_output_type}, "
                f"from the {self.ctx.topo.name} topology"
            )
        if "final_output" in s:
            out["final_output"] = bool(s["final_output"])
            report.map(f"{self.loc}.final_output", f"stages.{name}.final_output", s["final_output"])
        if "final_output_type" in s:
            out["final_output_type"] = s["final_output_type"]
            report.map(
                f"{self.loc}.final_output_type",
                f"stages.{name}.final_output_type",
                s["final_output_type"],
            )
        if self.deploy:
            return  # a deploy stage's other keys are its flat engine fields (engine())
        for k in s:
            if k not in _STAGE_KEYS:
                report.foreign(f"{self.loc}.{k}")


def _fit_max_tokens(out: dict[str, Any], name: str, report: ImportReport) -> None:
    """``sampling.max_tokens`` at or above ``max_model_len`` — vLLM-Omni's way of writing "up to
    the context" (its engine caps a reply at what the context has left) — as the largest value
    that loads here: one below ``max_model_len`` (``ArDecodeConfig`` keeps room for a prompt)."""
    sampling, limit = out.get("sampling") or {}, out.get("max_model_len")
    value = sampling.get("max_tokens")
    if not (
        isinstance(value, int)
        and isinstance(limit, int)
        and not isinstance(value, bool)
        and value >= limit > 1
    ):
        return
    sampling["max_tokens"] = limit - 1
    report.notes.append(
        f"stages.{name}.sampling.max_tokens: {limit - 1}, the largest that loads: the file's {value} is at or above "
        f'max_model_len {limit} (vLLM-Omni\'s "up to the context"). A request that leaves max_tokens to the '
        f"config gets what its prompt leaves of the context, as vLLM's server gives it; one that asks for more "
        f"than that is refused"
    )


def keep_only(
    stages: list[dict[str, Any]], only: list[str], topo: Topology, report: ImportReport, where: str
) -> list[dict[str, Any]]:
    """The stages ``only`` names; one whose consumers are all left out becomes a final output of
    what its stage of the topology hands on (``TopologyStage.hands_on``)."""
    names = [s["name"] for s in stages]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ConfigError.single(
            f"--only {','.join(only)}",
            f"no stage named {', '.join(unknown)} in {where}",
            f"use the imported stage names: {', '.join(names)}",
        )
    kept = [s for s in stages if s["name"] in only]
    for s in kept:
        dropped = [i for i in sources(s["inputs"]) if i != "request" and i not in only]
        if dropped:
            raise ConfigError.single(
                f"--only {','.join(only)}",
                f"{s['name']} takes its input from {', '.join(dropped)}, which is left out",
                f"keep {', '.join(dropped)} too",
            )
    for s in kept:
        fed = any(s["name"] in sources(k["inputs"]) for k in kept)
        if not fed and not s.get("final_output"):
            ts = topo.by_model_stage(s["name"])
            produced = get_kind(s["kind"]).produces
            sub = ts.hands_on if ts is not None else (produced[0] if produced else None)
            s["final_output"] = True
            if sub:
                s["final_output_type"] = sub
            report.notes.append(
                f"stages.{s['name']}.final_output: true ({sub}): the stages it fed are left out (--only)"
            )
    report.notes.append(
        f"--only {','.join(only)}: left out {', '.join(n for n in names if n not in only)}"
    )
    report.stages = [r for r in report.stages if r["name"] in only]
    return kept


_ORDER = (
    "name",
    "kind",
    "stage_id",
    "model",
    "model_stage",
    "artifact",
    "inputs",
    "join",
    "devices",
    "replicas",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "dtype",
    "enforce_eager",
    "sampling",
    "final_output",
    "final_output_type",
)


def _ordered(d: dict[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in (*_ORDER, *(k for k in d if k not in _ORDER)) if k in d}
