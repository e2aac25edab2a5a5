"""Messages between a RolloutClient and the ``specactor serve`` daemon.

One ZeroMQ frame per message (ROUTER on the daemon, DEALER on the client),
msgpack maps tagged by ``kind``, decoded with typed msgspec decoders: unknown
fields and wrong types are rejected with an error naming the field. Every call
carries a client-chosen ``call_id``; every reply names the call it answers.
A generate call is answered by one ``result`` per sample as each finishes
(``index`` = its place in input order), then ``done``.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from specactor import protocol
from specactor.protocol import RequestResult, SamplingParams


class _Call(msgspec.Struct, tag_field="kind", forbid_unknown_fields=True, kw_only=True):
    call_id: int


class Generate(_Call, tag="generate"):
    prompt_ids: list[list[int]]
    sampling_params: Union[SamplingParams, list[SamplingParams]] = msgspec.field(default_factory=SamplingParams)
    request_ids: list[str] | None = None
    model: str | None = None  # if given, must be the served model's name
    group_ids: list[str] | None = None  # one per prompt: a pool runs prompts sharing one on one replica


class Abort(_Call, tag="abort"):
    request_id: str


class WeightsChunk(_Call, tag="weights_chunk"):
    """One chunk of a weight update, forwarded as is to the weights' holders."""

    chunk: protocol.WeightsChunk


class CommitWeights(_Call, tag="commit_weights"):
    update_id: str
    version: int | None = None
    in_flight: str = "finish"
    path: str | None = None


class Pause(_Call, tag="pause"):
    pass


class Resume(_Call, tag="resume"):
    pass


class Health(_Call, tag="health"):
    pass


class Stats(_Call, tag="stats"):
    pass


class Heartbeat(_Call, tag="heartbeat"):
    """Sent by a client with calls outstanding, so the daemon knows it is alive (no reply)."""


Call = Union[Generate, Abort, WeightsChunk, CommitWeights, Pause, Resume, Health, Stats, Heartbeat]


class _Reply(msgspec.Struct, tag_field="kind", kw_only=True):
    call_id: int | None


class Result(_Reply, tag="result"):
    index: int
    result: RequestResult


class Done(_Reply, tag="done"):
    value: Any = None


class Failure(_Reply, tag="error"):
    error: str


Reply = Union[Result, Done, Failure]

_call_decoder = msgspec.msgpack.Decoder(Call)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_encoder = msgspec.msgpack.Encoder()


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def decode_call(body: bytes) -> Call:
    """Decode a client's call; ValueError naming what was wrong (field, type, kind)."""
    try:
        return _call_decoder.decode(body)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise ValueError(f"malformed call: {exc}") from None
    except ValueError as exc:  # invalid UTF-8
        raise ValueError(f"malformed call: {exc}") from None


def call_id_of(body: bytes) -> int | None:
    """The ``call_id`` of a body that failed to decode, if one can be read (for the error reply)."""
    try:
        raw = msgspec.msgpack.decode(body)
    except Exception:  # anything at all may arrive: it only decides whether the error names a call
        return None
    value = raw.get("call_id") if isinstance(raw, dict) else None
    fits = isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**64
    return value if fits else None


def decode_reply(body: bytes) -> Reply:
    return _reply_decoder.decode(body)
