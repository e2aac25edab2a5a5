"""Every kind of bad call gets an error reply naming the problem, while a valid request
running at the same time completes with the right tokens."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import zmq
import zmq.asyncio

from specactor import protocol as p
from specactor.protocol import SamplingParams
from specactor.server.client import RolloutClient
from tests.server.conftest import MAX_LEN, reference_tokens

pytestmark = pytest.mark.slow

VOCAB = 49152


def _generate(call_id: int, **fields) -> dict:
    return {"kind": "generate", "call_id": call_id, "prompt_ids": [[1, 2, 3]], **fields}


def _params(**fields) -> dict:
    return {"temperature": 1.0, "max_tokens": 8, **fields}


# (what is wrong, raw call body or a dict to msgpack, text the error must contain)
MALFORMED: list[tuple[str, object, str | None]] = [
    # first, while the concurrent valid request is certainly still running
    ("request id already in flight", _generate(22, request_ids=["valid"]), "already in flight"),
    ("not msgpack", b"\xc1\xc1garbage", "malformed call"),
    ("not a map", [1, 2, 3], "malformed call"),
    ("unknown kind", {"kind": "explode", "call_id": 3}, "$.kind"),
    ("unknown field", _generate(4, colour="red"), "unknown field `colour`"),
    ("missing field", {"kind": "generate", "call_id": 5}, "missing required field `prompt_ids`"),
    ("wrong type", _generate(6, prompt_ids=[[1, "two"]]), "$.prompt_ids[0][1]"),
    ("unknown sampling field", _generate(7, sampling_params={"tempreature": 1.0}), "unknown field `tempreature`"),
    ("wrong sampling type", _generate(8, sampling_params={"temperature": "hot"}), "$.sampling_params.temperature"),
    ("token id beyond vocabulary", _generate(9, prompt_ids=[[1, VOCAB + 5]]), "outside the vocabulary"),
    ("negative token id", _generate(10, prompt_ids=[[1, -3]]), "outside the vocabulary"),
    ("prompt longer than the context", _generate(11, prompt_ids=[[7] * (MAX_LEN + 10)]), "exceeds the context"),
    ("negative max_tokens", _generate(12, sampling_params=_params(max_tokens=-5)), "max_tokens must be >= 1"),
    ("absurd max_tokens", _generate(13, sampling_params=_params(max_tokens=10**9)), "exceeds the context"),
    ("negative temperature", _generate(14, sampling_params=_params(temperature=-0.5)), "temperature must be >= 0"),
    ("top_p zero", _generate(15, sampling_params=_params(top_p=0.0)), "top_p must be in (0, 1]"),
    ("top_p above one", _generate(16, sampling_params=_params(top_p=1.5)), "top_p must be in (0, 1]"),
    ("negative top_k", _generate(17, sampling_params=_params(top_k=-1)), "top_k must be >= 0"),
    ("zero samples", _generate(18, sampling_params=_params(n=0)), "n must be >= 1"),
    ("negative seed", _generate(19, sampling_params=_params(seed=-1)), "seed must be in"),
    ("stop token beyond vocabulary", _generate(20, sampling_params=_params(stop_token_ids=[VOCAB])),
     "stop token id"),
    ("duplicate request ids in one call", _generate(21, prompt_ids=[[1], [2]], request_ids=["dup", "dup"]),
     "duplicate request id 'dup'"),
    ("unknown model", _generate(23, model="llama-405b"), "unknown model 'llama-405b'"),
    ("empty prompt", _generate(24, prompt_ids=[[]]), "prompt is empty"),
    ("params count mismatch", _generate(25, prompt_ids=[[1], [2]], sampling_params=[_params()]),
     "1 sampling params for 2 prompts"),
    ("bad in_flight", {"kind": "commit_weights", "call_id": 26, "update_id": "u1", "in_flight": "later"},
     "in_flight must be one of finish, abort"),
    ("stale version", {"kind": "commit_weights", "call_id": 27, "update_id": "u2", "version": 0},
     "not newer than the running version 0"),
    ("weights of an unknown tensor",
     {"kind": "weights_chunk", "call_id": 0, "chunk": p.WeightsChunk(
         update_id="u3", name="evil.weight", dtype="float32", shape=[2], offset=0, total=8, data=b"\x00" * 8)}, None),
    ("commit of the unknown tensor", {"kind": "commit_weights", "call_id": 29, "update_id": "u3"},
     "'evil.weight' is not a weight of this model"),
    ("chunk whose size disagrees with its shape",
     {"kind": "weights_chunk", "call_id": 0, "chunk": p.WeightsChunk(
         update_id="u4", name="model.norm.weight", dtype="float32", shape=[64], offset=0, total=8,
         data=b"\x00" * 8)}, None),
    ("commit of the inconsistent chunk", {"kind": "commit_weights", "call_id": 31, "update_id": "u4"},
     "does not match float32 [64]"),
    ("chunk of a tensor bigger than the model's",
     {"kind": "weights_chunk", "call_id": 0, "chunk": p.WeightsChunk(
         update_id="u6", name="model.norm.weight", dtype="float32", shape=[50 << 30], offset=0, total=200 << 30,
         data=b"")}, None),
    ("commit of the huge tensor", {"kind": "commit_weights", "call_id": 33, "update_id": "u6"},
     "the model needs [64]"),
    ("reserved request id", _generate(34, request_ids=["*"]), "reserved"),
    ("more samples than the daemon takes", _generate(35, sampling_params=_params(n=2**62)), "samples"),
    ("checkpoint path that does not exist", {"kind": "commit_weights", "call_id": 32, "update_id": "u5",
                                             "path": "/nonexistent/ckpt"}, "neither a .safetensors file"),
]


@pytest.fixture(scope="module")
def daemon(daemon_factory, tiny_checkpoint):
    return daemon_factory("--mode", "specactor", "--model", str(tiny_checkpoint))


async def test_every_malformed_call_is_answered_and_a_concurrent_request_completes(daemon, tiny_model,
                                                                                  prompts) -> None:
    _, model, tok = tiny_model
    valid_params = SamplingParams(temperature=1.0, max_tokens=96, seed=77)
    ctx = zmq.asyncio.Context.instance()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(daemon.endpoint)
    async with RolloutClient(daemon.endpoint, timeout_s=120) as client:
        await client.pause()  # keeps "valid" in flight for the duplicate-id case
        valid = asyncio.create_task(client.generate(prompts[:1], valid_params, request_ids=["valid"]))
        while (await client.health())["in_flight"] < 1:
            await asyncio.sleep(0.05)
        await client.resume()
        kinds = 0
        for what, body, expected in MALFORMED:
            await raw.send(body if isinstance(body, bytes) else msgspec.msgpack.encode(body))
            if expected is None:  # a chunk is only answered at its commit
                continue
            reply = msgspec.msgpack.decode(await asyncio.wait_for(raw.recv(), 60))
            assert reply["kind"] == "error", f"{what}: got {reply}"
            assert expected in reply["error"], f"{what}: {reply['error']!r} does not say {expected!r}"
            if isinstance(body, dict):
                assert reply["call_id"] == body["call_id"], what
            kinds += 1
        await raw.send_multipart([b"", msgspec.msgpack.encode(_generate(40))])  # a REQ-style envelope
        reply = msgspec.msgpack.decode(await asyncio.wait_for(raw.recv(), 60))
        assert reply["kind"] == "error" and "a call is one frame, got 2" in reply["error"]
        kinds += 1
        assert kinds >= 15
        result = (await valid)[0]
        assert result.token_ids == reference_tokens(model, tok, prompts[0], valid_params, "valid")
        health = await client.health()
        assert health["ok"] and health["in_flight"] == 0 and health["policy_version"] == 0
        # and the daemon still serves normally afterwards
        again = await client.generate(prompts[:1], valid_params, request_ids=["valid"])
        assert again[0].token_ids == result.token_ids
    raw.close()
