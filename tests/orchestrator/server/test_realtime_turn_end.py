"""A realtime session's turn taking in this process: the real ``Session`` and its ``Turns``,
``Transcriber`` and ``Replies``, the vad stage's real Silero graph on speech the project's
Piper voice said, and stand-ins where a test must control the answer:

* the transcript: a stand-in for Whisper that "hears" one word more for each step of speech
  and the whole of each phrase once the phrase is over (counted from the audio: its loud
  frames and the silences between them), so which words a pass returns is a property of the
  audio the test built;
* the scorer: complete exactly when the transcript ends with the question's last word;
* the pipeline: each reply is a stand-in run that yields a token and a chunk of audio at
  once (``FakeRun``), so a reply started early has its audio ready, held, before the user
  goes on.

Order, not clocks: the audio is appended 20 ms at a time and after each append every task the
session started (transcript passes, verdicts, replies) is run to its end before the next one
(``settle``) — as if the CPU were infinitely fast beside the audio. What the session decides
is then a function of the samples alone: the same on any machine. Silence is counted in
samples appended, never in seconds waited."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import yaml

from orchestrator.config import parse_config
from orchestrator.core.errors import ConfigError
from orchestrator.planner import plan_pipeline
from orchestrator.runtime.audio import resample, rms_dbfs
from orchestrator.runtime.events import AudioChunk, TextDelta
from orchestrator.server.limits import ServerLimits
from orchestrator.server.realtime import (
    RealtimeLimits,
    Session,
    semantic_turn,
    turn_detection_problem,
)
from orchestrator.server.realtime_turn_end import TurnEnd, pauses
from stages.registry import get_kind
from stages.requests import TextRequest
from tests.helpers import REPO
from tests.helpers.speech import speak
from tests.helpers.waiting import NEVER_HANGS_S
from tests.stages.vad.test_kind import PLAIN, profile, vad_stage

pytestmark = [
    pytest.mark.ort,
    pytest.mark.skipif(
        importlib.util.find_spec("silero_vad") is None,
        reason="silero-vad is not installed (scripts/bootstrap.sh installs it with --no-deps)",
    ),
]

RATE = 16000
CHUNK = RATE // 50
"""20 ms appends, a microphone's frame."""
FIRST, SECOND = "I would like to know", "about the moon"
WHOLE = f"{FIRST} {SECOND}"
INNER_PAUSE_S = 0.6
"""The pause inside the question: longer than server_vad's 400 ms, shorter than semantic_vad's
800 ms for an utterance that is not complete (eagerness medium)."""
PAD_MS, SERVER_SILENCE_MS = 100, 400
SERVER_VAD = {
    "type": "server_vad",
    "threshold": 0.5,
    "prefix_padding_ms": PAD_MS,
    "silence_duration_ms": SERVER_SILENCE_MS,
    "create_response": True,
    "interrupt_response": True,
}


# -- the stand-ins ---------------------------------------------------------------------------
def loud_frames(samples: np.ndarray) -> list[bool]:
    n = RATE // 100
    return [rms_dbfs(samples[i : i + n]) > -45.0 for i in range(0, samples.size - n + 1, n)]


def phrases_in(samples: np.ndarray) -> list[int]:
    """Loud 10 ms frames of each phrase in ``samples`` (a silence of 300 ms or more between
    two: the test's inner pause, never a pause between Piper's words)."""
    out: list[int] = []
    quiet = 99
    for loud in loud_frames(samples):
        if loud:
            if quiet >= 30 or not out:
                out.append(0)
            out[-1] += 1
            quiet = 0
        else:
            quiet += 1
    return out


class StandInAsr:
    """Whisper's part: the words of each phrase heard, one per ``WORD_FRAMES`` of its speech,
    all of them once the phrase is followed by silence (it is over); tokens are word indices."""

    WORD_FRAMES = 20

    def __init__(self, phrases: list[str], spoken: list[int]) -> None:
        self.words = [p.split() for p in phrases]
        self.spoken = spoken
        """Loud frames of each phrase as spoken whole."""
        self.vocab = [w for p in self.words for w in p]

    def transcribe(
        self, item: dict[str, Any], prefix: list[int], cancel: Any
    ) -> tuple[list[int], frozenset[int]]:
        samples = resample(item["audio"], int(item["sample_rate"]), RATE)
        heard: list[int] = []
        base = 0
        for i, frames in enumerate(phrases_in(samples)):
            if i >= len(self.words):
                break
            whole = frames >= self.spoken[i] - 5
            n = len(self.words[i]) if whole else min(frames // self.WORD_FRAMES, len(self.words[i]))
            heard += list(range(base, base + n))
            base += len(self.words[i])
        tokens = prefix + heard[len(prefix) :]
        return tokens, frozenset(range(len(tokens)))

    def text_of(self, tokens: list[int]) -> str:
        return " ".join(self.vocab[t] for t in tokens)


class StandInScorer:
    """Complete exactly when the transcript ends with the question's last word."""

    def __init__(self, last_word: str) -> None:
        self.last = last_word
        self.asked: list[str] = []

    def load(self) -> None: ...

    def close(self) -> None: ...

    def complete(self, transcript: str) -> float:
        self.asked.append(transcript)
        return 1.0 if transcript.endswith(self.last) else 0.0


@dataclass
class FakeRun:
    """One reply through the "pipeline": a token and a chunk of audio, at once."""

    prompt: Any
    """The request the reply ran (the session's own transcript: a ``TextRequest``)."""
    entry: str | None
    yielded_audio: bool = False
    closed: bool = False

    @property
    def trace(self) -> Any:
        return type("Trace", (), {"usage": staticmethod(lambda: None)})()

    async def rest(self) -> AsyncIterator[Any]:
        yield TextDelta("thinker", "Sure.", "r", 0.0)
        self.yielded_audio = True
        yield AudioChunk("voice", np.full(2400, 0.1, np.float32), 24000, 0, "r", 0.0)

    async def close(self, status: int | None = None) -> None:
        self.closed = True


class Counter:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def labels(self, outcome: str) -> Any:
        counts = self.counts

        class One:
            def inc(self) -> None:
                counts[outcome] = counts.get(outcome, 0) + 1

        return One()


@dataclass
class FakeRealtime:
    """What a ``Session`` reads of ``Realtime``: the real VAD runner, the stand-ins above."""

    vad_runner: Any
    recogniser: Any
    scorer: StandInScorer
    runs: list[FakeRun] = field(default_factory=list)
    limits: RealtimeLimits = field(default_factory=RealtimeLimits)
    streaming: bool = True
    entry: str = "asr"
    text_entry: str = "thinker"
    reply_stages: frozenset[str] = frozenset({"thinker"})
    transcript_stages: frozenset[str] = frozenset({"asr"})
    audio_stages: frozenset[str] = frozenset({"voice"})
    decode_stages: tuple[str, ...] = ("thinker",)
    chunker: Any = None

    def __post_init__(self) -> None:
        self.vad_settings = dict(SERVER_VAD)
        self.defaults = dict(SERVER_VAD)
        self.metrics = type("Metrics", (), {})()
        self.metrics.early_responses = Counter()
        self.metrics.voice_to_voice = type("H", (), {"observe": lambda self, v: None})()
        self.app = type(
            "App", (), {"metrics": self.metrics, "model": "voice-chat", "limits": ServerLimits()}
        )()
        self._turn_end = TurnEnd(self.scorer)

    async def vad(self) -> Any:
        return self.vad_runner

    async def asr(self) -> Any:
        return self.recogniser

    def transcribe(self, item: Any, prefix: list[int], cancel: Any) -> Any:
        return self.recogniser.transcribe(item, prefix, cancel)

    def text_of(self, tokens: list[int]) -> str:
        return str(self.recogniser.text_of(tokens))

    def idle(self) -> bool:
        return True

    def asr_ready(self) -> bool:
        return True

    async def turn_end(self) -> TurnEnd:
        return self._turn_end

    def semantic_problem(self) -> None:
        return None

    def make_run(self, app: Any, prompt: Any, endpoint: str, **kw: Any) -> FakeRun:
        run = FakeRun(prompt, kw.get("entry"))
        self.runs.append(run)
        return run


class FakeSocket:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def send_text(self, text: str) -> None:
        self.events.append(json.loads(text))


# -- the harness -----------------------------------------------------------------------------
async def settle() -> None:
    """Run every task the session started to its end (passes, verdicts, replies)."""
    deadline = time.monotonic() + NEVER_HANGS_S
    me = asyncio.current_task()
    while True:
        pending = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        if not pending:
            return
        assert time.monotonic() < deadline, f"tasks still running: {pending}"
        await asyncio.wait(pending, timeout=1.0)


async def talk(session: Session, audio: np.ndarray) -> list[int]:
    """Append ``audio`` 20 ms at a time, settling after each; the samples appended when each
    event came (one entry per event the session sent)."""
    at: list[int] = []
    for i in range(0, audio.size, CHUNK):
        part = np.clip(audio[i : i + CHUNK], -1, 1)
        doc = {
            "type": "input_audio_buffer.append",
            "audio": base64.b64encode((part * 32767).astype("<i2").tobytes()).decode(),
        }
        await session.handle(json.dumps(doc))
        await settle()
        at += [i + part.size] * (len(session.ws.events) - len(at))
    return at


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), np.float32)


def trimmed(samples: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(samples) > 0.01)
    return samples[loud[0] : loud[-1] + 1]


@pytest.fixture(scope="module")
def vad_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    config = parse_config(
        {"name": "p", "stages": [vad_stage(PLAIN, min_silence_ms=SERVER_SILENCE_MS)]},
        where="t.yaml",
        base_dir=tmp_path_factory.mktemp("vad"),
    )
    plan = plan_pipeline(config, profile(), runtime=False)
    r = get_kind("vad").runner(plan.stage("vad"), config.stage("vad"))
    r.load()
    yield r
    r.close()


@pytest.fixture(scope="module")
def clips() -> dict[str, np.ndarray]:
    out = {}
    for text in (FIRST, SECOND, WHOLE):
        samples, rate = speak(text)
        out[text] = trimmed(resample(samples, rate, RATE))
    return out


def _session(vad_runner: Any, phrases: list[str], clips: dict[str, np.ndarray], turn: Any) -> Any:
    asr = StandInAsr(phrases, [sum(phrases_in(clips[p])) for p in phrases])
    rt = FakeRealtime(vad_runner, asr, StandInScorer(WHOLE.split()[-1]))
    session = Session(rt, FakeSocket())  # type: ignore[arg-type]
    session.in_rate = RATE
    session.turn = turn
    return session


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def _end_of(audio_before: int, clip: np.ndarray) -> int:
    """The sample of the stream where ``clip``'s speech ends (its last loud frame)."""
    frames = loud_frames(clip)
    last = max(i for i, loud in enumerate(frames) if loud)
    return audio_before + (last + 1) * (RATE // 100)


# -- the tests -------------------------------------------------------------------------------
def test_a_complete_question_ends_its_turn_after_the_short_pause(
    vad_runner: Any, clips: dict[str, np.ndarray]
) -> None:
    """One phrase, the whole question: judged complete at the pause, the turn is committed once
    the pause has lasted ``complete_ms`` (200) and well before ``incomplete_ms`` (800) of silence
    was appended; the reply started in the pause is the one the client gets."""
    p = pauses("medium")

    async def main() -> None:
        session = _session(vad_runner, [WHOLE], clips, semantic_turn("medium"))
        lead = silence(0.5)
        at = await talk(session, np.concatenate([lead, clips[WHOLE], silence(1.5)]))
        events = session.ws.events
        kinds = [e["type"] for e in events]
        assert kinds.count("input_audio_buffer.committed") == 1, kinds
        end = _end_of(lead.size, clips[WHOLE])
        committed_at = at[kinds.index("input_audio_buffer.committed")]
        silent_ms = 1000 * (committed_at - end) / RATE
        assert p.complete_ms <= silent_ms < p.incomplete_ms - 200, silent_ms
        assert session.rt.scorer.asked[-1] == WHOLE
        assert len(session.rt.runs) == 1 and session.rt.runs[0].prompt == TextRequest(WHOLE)
        done = _of(events, "response.done")[0]["response"]
        assert done["status"] == "completed" and done["timing"]["early_start"] is True
        # the committed event follows the end of speech the server placed, once
        stopped = _of(events, "input_audio_buffer.speech_stopped")[0]
        assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index(
            "input_audio_buffer.committed"
        )
        assert stopped["item_id"] == _of(events, "input_audio_buffer.committed")[0]["item_id"]

    asyncio.run(main())


def test_the_scorer_reads_the_committed_words_while_the_user_speaks(
    vad_runner: Any, clips: dict[str, np.ndarray]
) -> None:
    """Under semantic_vad each partial pass hands the words committed so far to the scorer (its
    cache keeps them), so the verdict at the pause reads only the words after them: the scorer
    was asked for a head of the question before it was asked for all of it."""

    async def main() -> None:
        session = _session(vad_runner, [WHOLE], clips, semantic_turn("medium"))
        await talk(session, np.concatenate([silence(0.5), clips[WHOLE], silence(1.5)]))
        asked = session.rt.scorer.asked
        assert WHOLE in asked, asked
        heads = asked[: asked.index(WHOLE)]
        assert heads and all(WHOLE.startswith(h) and h != WHOLE for h in heads), asked

    asyncio.run(main())


def _inner_pause_audio(clips: dict[str, np.ndarray]) -> tuple[np.ndarray, int]:
    lead = silence(0.5)
    audio = np.concatenate(
        [lead, clips[FIRST], silence(INNER_PAUSE_S), clips[SECOND], silence(1.5)]
    )
    end = _end_of(lead.size + clips[FIRST].size + int(INNER_PAUSE_S * RATE), clips[SECOND])
    return audio, end


def test_an_unfinished_question_waits_through_its_inner_pause_and_is_one_turn(
    vad_runner: Any, clips: dict[str, np.ndarray]
) -> None:
    """ "I would like to know … about the moon" with 600 ms between: the first phrase is judged
    not complete, so its pause waits for 800 ms and the speech resumes inside it — one turn,
    answered from all of it. The reply started early in the inner pause had its audio (held)
    when the user went on, and none of it reached the client."""

    async def main() -> None:
        session = _session(vad_runner, [FIRST, SECOND], clips, semantic_turn("medium"))
        audio, end = _inner_pause_audio(clips)
        at = await talk(session, audio)
        events = session.ws.events
        kinds = [e["type"] for e in events]
        assert kinds.count("input_audio_buffer.committed") == 1, kinds
        assert at[kinds.index("input_audio_buffer.committed")] > end  # after the whole question
        # judged at the inner pause (the heads read while the user spoke aside), then at the end
        assert FIRST in session.rt.scorer.asked and session.rt.scorer.asked[-1] == WHOLE
        # the inner pause's reply ran to its audio, held, and was dropped
        spoken = session.rt.runs[0]
        assert spoken.prompt == TextRequest(FIRST) and spoken.yielded_audio and spoken.closed
        assert session.rt.metrics.early_responses.counts.get("dropped", 0) >= 1
        created = _of(events, "response.created")
        assert len(created) == 1
        rid = created[0]["response"]["id"]
        assert {e["response_id"] for e in _of(events, "response.audio.delta")} == {rid}
        assert session.rt.runs[-1].prompt == TextRequest(
            WHOLE
        )  # the reply the client got: all of it
        completed = _of(events, "conversation.item.input_audio_transcription.completed")
        assert [c["transcript"] for c in completed] == [WHOLE]

    asyncio.run(main())


def test_server_vad_at_400_ms_cuts_the_same_question_at_its_inner_pause(
    vad_runner: Any, clips: dict[str, np.ndarray]
) -> None:
    """The same audio under a fixed 400 ms: two turns, the first one cut mid-question."""

    async def main() -> None:
        session = _session(vad_runner, [FIRST, SECOND], clips, dict(SERVER_VAD))
        audio, _ = _inner_pause_audio(clips)
        await talk(session, audio)
        events = session.ws.events
        assert len(_of(events, "input_audio_buffer.committed")) == 2
        completed = _of(events, "conversation.item.input_audio_transcription.completed")
        assert completed[0]["transcript"] == FIRST  # cut mid-question
        assert session.rt.scorer.asked == []  # server_vad asks no one

    asyncio.run(main())


def test_transcript_deltas_come_in_order_and_spell_the_final_transcript(
    vad_runner: Any, clips: dict[str, np.ndarray]
) -> None:
    """Words are committed while the user speaks (deltas before ``speech_stopped``), the rest
    after ``committed``; every delta names the turn's item and comes before its
    ``…transcription.completed``, whose transcript is the deltas joined."""

    async def main() -> None:
        session = _session(vad_runner, [FIRST, SECOND], clips, semantic_turn("medium"))
        audio, _ = _inner_pause_audio(clips)
        await talk(session, audio)
        events = session.ws.events
        kinds = [e["type"] for e in events]
        item = _of(events, "input_audio_buffer.committed")[0]["item_id"]
        deltas = [
            (i, e)
            for i, e in enumerate(events)
            if e["type"] == "conversation.item.input_audio_transcription.delta"
        ]
        assert deltas and all(e["item_id"] == item for _, e in deltas)
        completed = kinds.index("conversation.item.input_audio_transcription.completed")
        assert all(i < completed for i, _ in deltas)
        assert any(i < kinds.index("input_audio_buffer.speech_stopped") for i, _ in deltas)
        assert "".join(e["delta"] for _, e in deltas) == events[completed]["transcript"] == WHOLE
        assert kinds.index("input_audio_buffer.speech_started") < deltas[0][0]

    asyncio.run(main())


def test_a_pass_for_a_cleared_buffer_is_dropped(
    vad_runner: Any, clips: dict[str, np.ndarray]
) -> None:
    """``input_audio_buffer.clear`` while a pass on the speech is running: the segment is gone,
    and neither a delta nor a turn of it follows, though the pass ends after the clear."""

    async def main() -> None:
        session = _session(vad_runner, [WHOLE], clips, semantic_turn("medium"))
        gate, entered = threading.Event(), threading.Event()
        plain = session.rt.recogniser.transcribe

        def gated(item: Any, prefix: list[int], cancel: Any) -> Any:
            entered.set()
            assert gate.wait(NEVER_HANGS_S), "the test never opened the gate"
            return plain(item, prefix, cancel)

        session.rt.recogniser.transcribe = gated
        clip = np.concatenate([silence(0.5), clips[WHOLE]])
        for i in range(0, clip.size, CHUNK):  # until a pass is running, held at the gate
            part = (np.clip(clip[i : i + CHUNK], -1, 1) * 32767).astype("<i2").tobytes()
            await session.handle(
                json.dumps(
                    {"type": "input_audio_buffer.append", "audio": base64.b64encode(part).decode()}
                )
            )
            if entered.is_set():
                break
        assert entered.is_set(), "no pass started while the question was spoken"
        mark = len(session.ws.events)
        await session.handle(json.dumps({"type": "input_audio_buffer.clear"}))
        gate.set()
        await settle()
        transcriber = session.turns.transcriber
        assert transcriber.agreement.last is None and not transcriber.closing  # nothing of it kept
        await talk(session, silence(1.5))
        after = [e["type"] for e in session.ws.events[mark:]]
        assert after[0] == "input_audio_buffer.cleared", after
        assert "conversation.item.input_audio_transcription.delta" not in after
        assert "input_audio_buffer.committed" not in after

    asyncio.run(main())


# -- what cannot be served is refused by name ------------------------------------------------
def test_a_turn_detection_of_no_known_type_is_refused_in_the_config(tmp_path: Any) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(
            {"name": "p", "stages": [vad_stage(PLAIN, turn_detection={"type": "pause"})]},
            where="t.yaml",
            base_dir=tmp_path,
        )
    text = str(err.value)
    assert "stages[0].turn_detection" in text and "server_vad or semantic_vad" in text
    assert "how to fix: {type: server_vad}" in text


def test_semantic_vad_on_a_vad_stage_that_feeds_no_transcript_is_refused_before_planning(
    tmp_path: Any,
) -> None:
    """``serve`` asks this before anything is planned (exit 2): the vad stage must feed one
    stage that transcribes speech; with ``server_vad`` the same pipeline is fine."""

    def config(turn: dict[str, str]) -> Any:
        return parse_config(
            {"name": "p", "stages": [vad_stage(PLAIN, turn_detection=turn)]},
            where="t.yaml",
            base_dir=tmp_path,
        )

    problem = turn_detection_problem(config({"type": "semantic_vad", "eagerness": "high"}))
    assert problem is not None
    assert problem.where == "stages.vad.turn_detection"
    assert "feed one asr stage" in problem.what and "server_vad" in problem.fix
    assert turn_detection_problem(config({"type": "server_vad"})) is None


@pytest.mark.parametrize(
    ("turn", "param", "says"),
    [
        ({"type": "server_vad", "eagerness": "high"}, "eagerness", "semantic_vad's"),
        ({"type": "semantic_vad", "silence_duration_ms": 300}, "silence_duration_ms", "leave"),
        ({"type": "semantic_vad", "eagerness": "soon"}, "eagerness", "'low', 'medium'"),
        ({"type": "push_to_talk"}, "turn_detection", "'server_vad' or 'semantic_vad'"),
    ],
)
def test_a_session_update_mixing_the_two_types_is_an_error_event_naming_the_field(
    vad_runner: Any, clips: dict[str, np.ndarray], turn: dict[str, Any], param: str, says: str
) -> None:
    """An error event naming the field and how to fix it; the session's turn detection stays."""

    async def main() -> None:
        session = _session(vad_runner, [WHOLE], clips, dict(SERVER_VAD))
        await session.handle(
            json.dumps({"type": "session.update", "session": {"turn_detection": turn}})
        )
        errors = _of(session.ws.events, "error")
        assert len(errors) == 1, session.ws.events
        error = errors[0]["error"]
        assert error["param"].startswith("session.turn_detection"), error
        assert error["param"].endswith(param) and says in error["message"], error
        assert session.turn == SERVER_VAD

    asyncio.run(main())


def test_a_session_update_to_semantic_vad_keeps_its_eagerness() -> None:
    assert semantic_turn("high") == {
        "type": "semantic_vad",
        "eagerness": "high",
        "create_response": True,
        "interrupt_response": True,
    }


def _voice_chat(turn: dict[str, str], *, thinker: bool = True) -> Any:
    """configs/examples/voice-chat.yaml with the vad stage's ``turn_detection`` set (and, with
    ``thinker=False``, the voice fed by the asr stage directly)."""
    path = REPO / "configs" / "examples" / "voice-chat.yaml"
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    doc["stages"][0]["turn_detection"] = turn
    if not thinker:
        doc["stages"] = [s for s in doc["stages"] if s["name"] != "thinker"]
        doc["stages"][-1]["inputs"] = ["asr"]
    return parse_config(doc, where=str(path), base_dir=path.parent)


def test_semantic_vad_is_served_where_a_transcript_reaches_a_model_that_scores_it() -> None:
    """vad → asr → thinker (ar_decode): the kinds say they transcribe and score; the same
    pipeline with the voice fed by the asr stage has no model to score the transcript."""
    semantic = {"type": "semantic_vad", "eagerness": "low"}
    assert turn_detection_problem(_voice_chat(semantic)) is None
    problem = turn_detection_problem(_voice_chat(semantic, thinker=False))
    assert problem is not None and problem.where == "stages.vad.turn_detection"
    assert "'asr' to feed one ar_decode stage" in problem.what
    config = _voice_chat(semantic)
    vad = config.stage("vad")
    assert get_kind(vad.kind).semantic_eagerness(vad) == "low"
    plain = _voice_chat({"type": "server_vad"}).stage("vad")
    assert get_kind(plain.kind).semantic_eagerness(plain) is None
