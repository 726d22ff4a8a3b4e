"""``stages.ar_decode.stops.StopText``: a reply cut at its first stop string, whatever the
deltas it streams in; nothing of a stop string, nor after it, is ever sent."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from orchestrator.core.errors import BadRequest
from stages.ar_decode.engines.transformers import TransformersEngine
from stages.ar_decode.prompt import check_request, check_served
from stages.ar_decode.stops import StopText
from tests.helpers import REPO

TEXT = "One, two, three, four, five, six. Fin."


def _stream(text: str, cuts: list[int], stops: list[str]) -> tuple[list[str], bool]:
    s = StopText(stops)
    bounds = [0, *cuts, len(text)]
    out = [s.add(text[a:b]) for a, b in itertools.pairwise(bounds)]
    stopped = s.stopped
    out.append(s.flush())
    return out, stopped


@pytest.mark.parametrize(
    "stops",
    [["five"], ["five", "four"], ["six.", "Fi"], ["e, f"], ["nowhere"], ["Fin.x"], []],
)
def test_every_split_of_the_reply_gives_the_text_before_the_first_stop(stops: list[str]) -> None:
    firsts = [i for i in (TEXT.find(s) for s in stops) if i >= 0]
    expected = TEXT[: min(firsts)] if firsts else TEXT
    for a in range(len(TEXT) + 1):  # every split in two and in three deltas
        for b in range(a, len(TEXT) + 1, 3):
            out, stopped = _stream(TEXT, [a, b], stops)
            assert "".join(out) == expected, (a, b)
            assert stopped == bool(firsts)
            assert not any(s in "".join(out[: i + 1]) for i in range(len(out)) for s in stops)


def test_a_delta_that_may_begin_a_stop_is_held_until_it_cannot() -> None:
    s = StopText(["five"])
    assert s.add("four fi") == "four "  # "fi" may begin "five"
    assert s.add("g") == "fig"  # it did not
    assert s.add("ve") == "ve" and not s.stopped
    s = StopText(["five"])
    assert (s.add("fi"), s.add("ve and more"), s.stopped) == ("", "", True)
    assert s.add("anything") == "" and s.flush() == ""


def _stage() -> object:
    from orchestrator.config import load_config

    return load_config(REPO / "configs/voice-assistant.yaml").stage("thinker")


@pytest.mark.parametrize(
    ("key", "value"), [("stop", ["five"]), ("presence_penalty", 0.5), ("frequency_penalty", -1.0)]
)
def test_a_backend_that_cannot_apply_a_sampling_key_refuses_the_request_by_name(
    key: str, value: object
) -> None:
    def check(s: Any) -> None:
        check_served(s, TransformersEngine.unserved_sampling, "transformers-cpu")

    request = {"prompt": "Hi", "sampling": {key: value}}
    with pytest.raises(BadRequest) as err:
        check_request(_stage(), None, request, check)
    p = err.value.problems[0]
    assert p.where == f"request.sampling.{key}" and "transformers-cpu cannot apply it" in p.what
    assert "llamacpp-cpu" in p.fix
    # the off values ask for nothing: served as before
    off = {"stop": [], "presence_penalty": 0.0, "frequency_penalty": 0}[key]
    check_request(_stage(), None, {"prompt": "Hi", "sampling": {key: off}}, check)
