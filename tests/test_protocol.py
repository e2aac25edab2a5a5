"""Wire format: every message round-trips; nothing else decodes."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from specactor import protocol as p

PARAMS = p.SamplingParams(temperature=0.7, top_p=0.9, top_k=50, max_tokens=32,
                          stop_token_ids=[2, 7], seed=123, n=4, logprobs=True)

EXAMPLES: dict[type, p._Msg] = {
    p.Ping: p.Ping(seq=3, sent_ns=10**18),
    p.Pong: p.Pong(seq=3, sent_ns=5),
    p.Stop: p.Stop(reason="shutdown", expect_goodbyes=False),
    p.Goodbye: p.Goodbye(name="verifier"),
    p.GoodbyeAck: p.GoodbyeAck(name="sink"),
    p.Error: p.Error(code="bad_message", message="unknown kind 99", ref="r1"),
    p.Ready: p.Ready(name="drafter-0", address="ipc:///tmp/x/drafter-0", pid=4242),
    p.PeerDirectory: p.PeerDirectory(peers={"a": "inproc://a", "b": "tcp://127.0.0.1:5555"}, version=3),
    p.DirectoryAck: p.DirectoryAck(name="a", version=3),
    p.PeerDown: p.PeerDown(name="drafter-0", reason="process exited with code -9"),
    p.Heartbeat: p.Heartbeat(name="a", seq=77),
    p.Payload: p.Payload(seq=1, data=b"\x00\xffbytes"),
    p.StatsRequest: p.StatsRequest(),
    p.StatsReply: p.StatsReply(name="v", values={"tokens_per_s": 12.5}),
    p.GenerateRequest: p.GenerateRequest(request_id="r1", prompt_ids=[1, 2, 3], params=PARAMS, reply_to="client",
                                         resume_ids=[4, 5], resume_logprobs=[-1.0, -2.0], progress=True),
    p.GenerateBatch: p.GenerateBatch(requests=[
        p.GenerateRequest(request_id="r1#0", prompt_ids=[1, 2, 3], params=PARAMS, reply_to="client", progress=True),
        p.GenerateRequest(request_id="r1#1", prompt_ids=[1, 2, 3], params=PARAMS, reply_to="client")]),
    p.AbortRequest: p.AbortRequest(request_id="r1"),
    p.Draft: p.Draft(request_id="r1", method="ngram", start=4, tokens=[9, 8, 7], draft_ns=1200),
    p.DraftBatch: p.DraftBatch(drafter="ngram", drafts=[p.Draft(request_id="r1", method="ngram", start=0, tokens=[1])]),
    p.Verdict: p.Verdict(request_id="r1", start=4, tokens=[9, 8, 5], accepted=2, drafted=3, method="ngram",
                         scores={"ngram": [3, 2], "suffix": [2, 1]}),
    p.VerdictBatch: p.VerdictBatch(step=7, verdicts=[p.Verdict(request_id="r1", start=0, tokens=[1], accepted=0, drafted=0)],
                                   step_ns=999, batch_size=1),
    p.Track: p.Track(request_id="r1", context_ids=[1, 2], prompt_len=2, window=8, mode=p.DraftMode.COUPLED,
                     seed=5, temperature=1.0),
    p.Untrack: p.Untrack(request_id="r1"),
    p.Rollouts: p.Rollouts(prompts=[[1, 2]], outputs=[[3, 4, 5]]),
    p.Assignment: p.Assignment(request_id="r1", methods=["ngram", "model"], window=6, mode=p.DraftMode.DECOUPLED,
                               reason="tail racing"),
    p.AssignmentBatch: p.AssignmentBatch(assignments=[p.Assignment(request_id="r2", methods=[], window=0,
                                                                   mode=p.DraftMode.COUPLED, reason="off")]),
    p.RequestResult: p.RequestResult(
        request_id="r1", prompt_ids=[1], token_ids=[5, 6], logprobs=[-0.5, -1.25],
        finish_reason=p.FinishReason.LENGTH,
        stats=p.RequestStats(drafted=4, accepted=3, verify_steps=2, per_method={"ngram": {"drafted": 4, "accepted": 3}}),
        policy_version=2,
    ),
    p.WeightsChunk: p.WeightsChunk(update_id="u1", name="model.norm.weight", dtype="bfloat16", shape=[2, 3],
                                   offset=4, total=12, data=b"\x00\x01\x02\x03"),
    p.WeightsCommit: p.WeightsCommit(update_id="u1", version=3, in_flight="abort", path="/ckpt"),
    p.Pause: p.Pause(ref="p1"),
    p.Resume: p.Resume(ref="p2"),
    p.ControlAck: p.ControlAck(ref="u1", ok=False, detail="update is missing 1 weight(s)", version=2),
    p.Progress: p.Progress(version=2, partials=[p.Partial(request_id="r1", start=3, token_ids=[7, 8],
                                                          logprobs=[-0.5, -0.25])]),
}


def test_every_message_type_has_an_example() -> None:
    assert set(EXAMPLES) == set(p.MESSAGE_TYPES)


@pytest.mark.parametrize("kind", list(EXAMPLES), ids=lambda t: t.__name__)
def test_round_trip(kind: type) -> None:
    msg = EXAMPLES[kind]
    body = p.encode(msg)
    decoded = p.decode(body)
    assert type(decoded) is kind
    assert decoded == msg


def test_tags_are_unique_small_integers() -> None:
    tags = [t.__struct_config__.tag for t in p.MESSAGE_TYPES]
    assert len(set(tags)) == len(tags)
    assert all(isinstance(t, int) and 0 < t < 128 for t in tags)
    # the kind is the first byte after the msgpack array header
    for kind, msg in EXAMPLES.items():
        assert p.encode(msg)[1] == kind.__struct_config__.tag


def test_unknown_tag_is_rejected() -> None:
    with pytest.raises(p.ProtocolError, match="99"):
        p.decode(msgspec.msgpack.encode([99, 1]))


def test_wrong_field_type_is_rejected_with_the_field_named() -> None:
    with pytest.raises(p.ProtocolError, match="seq"):
        p.decode(msgspec.msgpack.encode([1, "not-an-int", 0]))


def test_missing_field_is_rejected() -> None:
    with pytest.raises(p.ProtocolError):
        p.decode(msgspec.msgpack.encode([5, "code-only"]))


def test_pickle_is_not_a_message() -> None:
    import pickle

    with pytest.raises(p.ProtocolError):
        p.decode(pickle.dumps(EXAMPLES[p.Ping]))


@settings(max_examples=300)
@given(st.binary(max_size=256))
@example(b"\xdc\x00\x02\x15\xa1\x80")  # a known message kind whose str field is invalid UTF-8 (found by this test)
def test_random_bytes_never_escape_as_other_errors(data: bytes) -> None:
    try:
        msg = p.decode(data)
    except p.ProtocolError:
        return
    assert type(msg) in p.MESSAGE_TYPES


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("temperature", -0.1, "temperature"),
        ("temperature", float("nan"), "temperature"),
        ("top_p", 0.0, "top_p"),
        ("top_p", 1.5, "top_p"),
        ("top_k", -1, "top_k"),
        ("max_tokens", 0, "max_tokens"),
        ("n", 0, "n must"),
        ("stop_token_ids", [-3], "stop_token_ids"),
        ("seed", -1, "seed"),
    ],
)
def test_sampling_params_validation_names_the_field(field: str, value: object, match: str) -> None:
    params = msgspec.structs.replace(p.SamplingParams(), **{field: value})
    with pytest.raises(ValueError, match=match):
        params.validate()


def test_default_sampling_params_are_valid() -> None:
    p.SamplingParams().validate()
    PARAMS.validate()
