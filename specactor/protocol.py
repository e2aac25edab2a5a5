"""Every message that crosses an actor boundary.

Messages are msgspec Structs in one tagged union. Each struct is encoded as a
msgpack array whose first element is a small integer tag, so the message kind
is the first byte of the body and decoding is typed from the first byte on.
Nothing else is accepted: a body that does not decode to a known message with
the right field types raises :class:`ProtocolError`. There is no pickle here.

On the wire a message is two ZeroMQ frames, ``[sender, body]``: the sender's
actor name travels outside the body so that an actor can send an error reply
even when the body itself is garbage.
"""

from __future__ import annotations

import enum
import re
from typing import Union

import msgspec

__all__ = [
    "Message",
    "ProtocolError",
    "encode",
    "decode",
    "frames",
    "FinishReason",
    "DraftMode",
    "SamplingParams",
]


class ProtocolError(ValueError):
    """A frame that is not a valid message; the text says what was wrong."""


class _Msg(msgspec.Struct, array_like=True, tag_field="kind", kw_only=True):
    """Base of all wire messages (array-encoded, integer-tagged)."""


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class DraftMode(enum.StrEnum):
    COUPLED = "coupled"
    DECOUPLED = "decoupled"
    OFF = "off"


# --------------------------------------------------------------------------
# Sampling parameters (not a message on its own; embedded in requests)
# --------------------------------------------------------------------------


class SamplingParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How to sample one request. ``top_k=0`` and ``top_p=1`` mean no truncation.

    Sample ``i`` of the request named ``X`` samples with the seed derived from
    (``seed``, ``X``, ``i``); ``seed=None`` stands for the engine's seed
    (``EngineConfig.seed``). See ``specactor.seeds``.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    stop_token_ids: list[int] = []
    seed: int | None = None
    n: int = 1
    logprobs: bool = True

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        if not (self.temperature >= 0.0) or self.temperature != self.temperature:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be non-negative token ids")
        if self.seed is not None and not (0 <= self.seed < 2**63):
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")


# --------------------------------------------------------------------------
# Control: lifecycle, liveness, errors
# --------------------------------------------------------------------------


class Ping(_Msg, tag=1):
    seq: int
    sent_ns: int = 0


class Pong(_Msg, tag=2):
    seq: int
    sent_ns: int = 0


class Stop(_Msg, tag=3):
    """Ask an actor to drain its inbox and exit.

    With ``expect_goodbyes`` (a whole-system shutdown) the actor serves on
    until every live peer has said Goodbye, so nothing in flight is lost.
    """

    reason: str = ""
    expect_goodbyes: bool = True


class Goodbye(_Msg, tag=4):
    """Last message an actor sends to each peer: nothing follows on this pipe."""

    name: str


class GoodbyeAck(_Msg, tag=14):
    """``name`` has received everything sent before the acknowledged Goodbye.

    ZeroMQ drops frames in flight when a sender disconnects while the receiver
    is at its high-water mark, so a stopping actor keeps its sockets open until
    each live peer has acknowledged its Goodbye.
    """

    name: str


class Error(_Msg, tag=5):
    """Error reply / report. ``ref`` names the request or message concerned."""

    code: str
    message: str
    ref: str = ""


class Ready(_Msg, tag=6):
    """An actor's inbox is bound at ``address``; sent to the supervisor."""

    name: str
    address: str
    pid: int


class PeerDirectory(_Msg, tag=7):
    """Name -> address book of every live actor, sent by the supervisor."""

    peers: dict[str, str]
    version: int = 0


class DirectoryAck(_Msg, tag=13):
    """An actor now knows directory ``version`` (so sends to new peers work)."""

    name: str
    version: int


class PeerDown(_Msg, tag=8):
    """The supervisor saw ``name`` crash or hang. ``restarting``: it is starting a new one (a
    PeerDirectory naming it says when it serves); else it is gone for good."""

    name: str
    reason: str
    restarting: bool = False


class Heartbeat(_Msg, tag=9):
    name: str
    seq: int


class Payload(_Msg, tag=10):
    """Opaque bytes for tests and benchmarks of the transport itself."""

    seq: int
    data: bytes = b""


class StatsRequest(_Msg, tag=11):
    """Ask an actor for its live counters."""


class StatsReply(_Msg, tag=12):
    name: str
    values: dict[str, float]


# --------------------------------------------------------------------------
# Rollout: requests, drafts, verdicts, results, assignments
# --------------------------------------------------------------------------


class GenerateRequest(_Msg, tag=20):
    """``resume_ids``/``resume_logprobs``: output already committed (by a verifier that died): the
    request goes on from there; position-keyed sampling makes the rest what it would have been.
    ``progress``: the reply_to wants its committed tokens as they come (:class:`Progress`)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    reply_to: str = ""
    resume_ids: list[int] = []
    resume_logprobs: list[float] = []
    progress: bool = False


class GenerateBatch(_Msg, tag=38):
    """The samples of one call in one message, so that the verifier admits them together and
    prefills their prompts in one step. Sent one by one, a step could start between them: on an
    H100 the prompts then took two eager prefill steps (the second 33-58 ms, where a decode step
    takes 7), a few percent of a short rollout."""

    requests: list[GenerateRequest]


class AbortRequest(_Msg, tag=21):
    request_id: str
    reason: str = "aborted by client"


class Draft(_Msg, tag=22):
    """Tokens proposed for output positions ``start .. start+len(tokens)-1``.

    ``start`` is the number of output tokens the drafter believed committed
    when it drafted; the verifier uses it to trim or drop stale drafts.
    """

    request_id: str
    method: str
    start: int
    tokens: list[int]
    draft_ns: int = 0


class DraftBatch(_Msg, tag=23):
    """All drafts one drafter produced since its last send (one per step)."""

    drafter: str
    drafts: list[Draft]


class Verdict(_Msg, tag=24):
    """What the verifier committed for one request in one step.

    ``start`` is the committed length before this step, ``tokens`` the tokens
    committed in this step (accepted draft prefix plus the verifier's own).
    When several methods raced, ``method`` is the winner and ``scores`` holds
    ``[drafted, accepted]`` for each of them. ``max_tokens`` (0: not told) and
    ``greedy`` are the request's sampling limits, for the policy: a rollout
    batch is done when its last sample is (:mod:`specactor.policy.makespan`).
    """

    request_id: str
    start: int
    tokens: list[int]
    accepted: int
    drafted: int
    method: str = ""
    finished: bool = False
    scores: dict[str, list[int]] = {}
    max_tokens: int = 0
    greedy: bool = False
    prompt_len: int = 0  # 0: not told (a model drafter's first draft feeds prompt + output first)


class VerdictBatch(_Msg, tag=25):
    """One step's verdicts; ``waiting``: requests accepted but not yet running when it ran (while
    any wait for a slot, a request that finishes early gives its slot to the next one)."""

    step: int
    verdicts: list[Verdict]
    step_ns: int = 0
    batch_size: int = 0
    waiting: int = 0
    lent: bool = False  # the forward ran on a model drafter's idle cores too (VerifyActor.lend_threads)


class Track(_Msg, tag=26):
    """Tell a drafter to start drafting for a request from its context."""

    request_id: str
    context_ids: list[int]
    prompt_len: int
    window: int
    mode: DraftMode = DraftMode.DECOUPLED
    seed: int = 0
    temperature: float = 1.0


class Untrack(_Msg, tag=27):
    """Stop drafting for a request. ``park``: the request goes on without this drafter for now (the
    policy turned it off, or changes its mode); a drafter whose state is cheap to keep (a lookup)
    keeps it, so that a later Track of the same request only catches up with what was committed
    meanwhile, and a final verdict (start 0, the whole output, ``finished``) tells it the end."""

    request_id: str
    park: bool = False


class Rollouts(_Msg, tag=36):
    """Finished samples' committed tokens, for drafters that learn from the policy's rollouts.
    ``idle``: the verifier had nothing left to run when it sent them (the end of an RL step's
    rollout), so a learner may train now without taking time from a rollout. An empty batch with
    ``idle`` False says that requests came in again after an idle one: a learner stops training."""

    prompts: list[list[int]]
    outputs: list[list[int]]
    idle: bool = False


class Assignment(_Msg, tag=28):
    """The policy's choice for one request (``"*"``: for requests yet to come).

    ``methods`` are drafting method names (empty: no speculation); with
    ``race`` every method's draft is verified in the same forward.
    """

    request_id: str
    methods: list[str]
    window: int
    mode: DraftMode
    reason: str = ""
    race: bool = False


class AssignmentBatch(_Msg, tag=30):
    """Every assignment the policy changed after one verify step (one message per step)."""

    assignments: list[Assignment]


# --------------------------------------------------------------------------
# Between RL steps: weight updates, pause / resume
# --------------------------------------------------------------------------


class WeightsChunk(_Msg, tag=31):
    """Bytes ``offset .. offset+len(data)`` of one tensor of a weight update.

    ``name`` is the Hugging Face parameter name, ``dtype`` a torch dtype name
    (``float32``, ``bfloat16``, ...), ``total`` the tensor's size in bytes.
    Raw little-endian bytes: no pickle.
    """

    update_id: str
    name: str
    dtype: str
    shape: list[int]
    offset: int
    total: int
    data: bytes


class WeightsCommit(_Msg, tag=32):
    """Apply update ``update_id`` (its chunks, or the checkpoint at ``path``) as ``version``.

    ``in_flight``: ``"finish"`` lets running requests finish on the old
    weights first (new ones wait); ``"abort"`` aborts them.
    """

    update_id: str
    version: int
    in_flight: str = "finish"
    path: str = ""


class Partial(msgspec.Struct, array_like=True):
    """Output tokens of one running request committed since ``start`` (not a message of its own)."""

    request_id: str
    start: int
    token_ids: list[int]
    logprobs: list[float]


class Progress(_Msg, tag=37):
    """The verifier's committed tokens since its last Progress (about once a second), to each
    request's ``reply_to``: what a restarted verifier resumes the request from (weights of
    ``version``)."""

    version: int
    partials: list[Partial]


class Pause(_Msg, tag=33):
    """Stop stepping after the current step (requests keep their state)."""

    ref: str


class Resume(_Msg, tag=34):
    ref: str


class ControlAck(_Msg, tag=35):
    """Answer to WeightsCommit, Pause or Resume (``ref``: update id or the request's ref)."""

    ref: str
    ok: bool
    detail: str = ""
    version: int = 0


class RequestStats(msgspec.Struct, kw_only=True):
    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0
    per_method: dict[str, dict[str, int]] = {}


class RequestResult(_Msg, tag=29):
    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    stats: RequestStats = msgspec.field(default_factory=RequestStats)
    policy_version: int = 0
    error: str = ""


Message = Union[
    Ping,
    Pong,
    Stop,
    Goodbye,
    GoodbyeAck,
    Error,
    Ready,
    PeerDirectory,
    PeerDown,
    Heartbeat,
    Payload,
    StatsRequest,
    StatsReply,
    DirectoryAck,
    GenerateRequest,
    GenerateBatch,
    AbortRequest,
    Draft,
    DraftBatch,
    Verdict,
    VerdictBatch,
    Track,
    Untrack,
    Assignment,
    RequestResult,
    AssignmentBatch,
    WeightsChunk,
    WeightsCommit,
    Pause,
    Resume,
    ControlAck,
    Rollouts,
    Progress,
]

MESSAGE_TYPES: tuple[type[_Msg], ...] = Message.__args__  # type: ignore[attr-defined]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: _Msg) -> bytes:
    """Encode one message body."""
    return _encoder.encode(msg)


_BY_TAG: dict[int, type[_Msg]] = {t.__struct_config__.tag: t for t in MESSAGE_TYPES}  # type: ignore[misc]
_POSITION = re.compile(r"`\$\[(\d+)\]")


def _explain(body: bytes | memoryview, error: str) -> str:
    """Turn msgspec's array positions (``$[2]``) into ``Kind.field`` names."""
    try:
        raw = msgspec.msgpack.decode(body)
    except (msgspec.DecodeError, ValueError):  # invalid UTF-8 raises ValueError
        return error
    if not isinstance(raw, list) or not raw:
        return f"{error} (a message is a msgpack array starting with its kind)"
    kind = _BY_TAG.get(raw[0]) if isinstance(raw[0], int) else None
    if kind is None:
        return f"unknown message kind {raw[0]!r}: {error}"
    match = _POSITION.search(error)
    if match and 0 < int(match.group(1)) <= len(kind.__struct_fields__):
        field = kind.__struct_fields__[int(match.group(1)) - 1]
        return f"{kind.__name__}.{field}: {error}"
    return f"{kind.__name__}: {error}"


def decode(body: bytes | memoryview) -> Message:
    """Decode one message body; raise ProtocolError naming what was wrong."""
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError as exc:  # ValidationError is a subclass
        raise ProtocolError(_explain(body, str(exc))) from None
    except UnicodeDecodeError as exc:  # a str field holding invalid UTF-8 escapes msgspec as this
        raise ProtocolError(f"a string is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def frames(sender: str, msg: _Msg) -> list[bytes]:
    """The two ZeroMQ frames for ``msg`` sent by ``sender``."""
    return [sender.encode(), _encoder.encode(msg)]
