"""A request's kind is its type: what a caller of the Python API passes becomes one record,
once (``as_request``), and a record says its payload, its label and the item its entry stage
receives. No Ray, no stage: the records alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stages.requests import (
    AudioRequest,
    ChatRequest,
    OtherRequest,
    TensorRequest,
    TextRequest,
    TokenIdsRequest,
    as_request,
)

CHAT = {
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "sampling": {"max_tokens": 8, "temperature": 0.0, "seed": None},
}


@pytest.mark.parametrize(
    ("value", "record", "payload"),
    [
        ("Hello there", TextRequest, "text"),
        (CHAT, ChatRequest, "text"),
        ({"prompt": "Hi", "sampling": {"top_k": 40}}, ChatRequest, "text"),
        ({"audio": np.zeros(1600, np.float32), "sample_rate": 16000}, AudioRequest, "audio"),
        ({"audio": [0.0, 0.1], "sample_rate": 8000}, AudioRequest, "audio"),
        (np.zeros((2, 3), np.float32), TensorRequest, "tensor"),
        ({"embedding": np.zeros(384, np.float32)}, TensorRequest, "tensor"),
        ([1, 2, 3], TokenIdsRequest, "token_ids"),
    ],
)
def test_what_a_caller_passes_becomes_the_record_of_its_payload(
    value: Any, record: type, payload: str
) -> None:
    request = as_request(value)
    assert type(request) is record and request.payload == payload
    assert as_request(request) is request  # a record is taken as it is: converted once


@pytest.mark.parametrize(
    "value",
    [
        42,
        None,
        {"prompt": 7},  # a chat field of the wrong type
        {"prompt": "hi", "sampling": {"temprature": 0.5}},  # a sampling key that is none
        {"prompt": "hi", "sampling": {"max_tokens": "8"}},  # a count that is no number
        {"prompt": "hi", "extra": 1},  # a key no chat request has
        {"audio": [0.0, 0.1]},  # audio without its rate
        {"audio": [0.0], "sample_rate": "16000"},  # a rate that is no number
        {"script": ["You said", " hi."]},  # a plugin kind's own shape
        [True, False],  # bools are no token ids
        [],
    ],
)
def test_a_value_of_no_payloads_shape_is_kept_as_it_came_for_the_kind_to_judge(
    value: Any,
) -> None:
    request = as_request(value)
    assert isinstance(request, OtherRequest) and request.payload is None
    assert request.item() is value  # what the stage that takes the request judges
    assert request.described == f"a {type(value).__name__}"


def test_a_chat_request_hands_its_stage_the_dict_it_was_given() -> None:
    request = as_request(CHAT)
    assert isinstance(request, ChatRequest)
    assert request.item() == CHAT
    assert as_request({"prompt": "Hi"}).item() == {"prompt": "Hi"}
    built = ChatRequest(({"role": "user", "content": "Hi"},), sampling={"max_tokens": 4})
    assert built.item() == {
        "messages": [{"role": "user", "content": "Hi"}],
        "sampling": {"max_tokens": 4},
    }


def test_each_record_names_itself_as_a_result_and_a_refusal_say_it() -> None:
    assert as_request("Tell me a fact.").label() == "Tell me a fact."
    audio = as_request({"audio": np.zeros(8000, np.float32), "sample_rate": 16000})
    assert audio.label() == "(audio: 0.50 s at 16000 Hz)"
    assert as_request(np.zeros((2, 3), np.float32)).label() == "(tensor: float32[2, 3])"
    named = as_request({"a": np.zeros(4, np.int64), "b": np.zeros((1, 2), np.float32)})
    assert named.label() == "(tensor: a int64[4], b float32[1, 2])"
    assert as_request([5, 6]).label() == "[5, 6]"
    assert [as_request(v).described for v in ("x", CHAT, [1], np.zeros(1))] == [
        "text",
        "a chat request",
        "token ids",
        "a tensor",
    ]


def test_an_audio_record_hands_its_stage_the_audio_item() -> None:
    samples = np.ones(4, np.float32)
    request = AudioRequest(samples, 24000)
    item = request.item()
    assert item["sample_rate"] == 24000 and item["audio"] is samples
    again = as_request(item)
    assert isinstance(again, AudioRequest)
    assert again.samples is samples and again.sample_rate == 24000
