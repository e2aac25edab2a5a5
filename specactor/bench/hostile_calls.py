"""Hostile calls for the daemon, as hypothesis strategies: random bytes, random msgpack, maps of
the real call kinds with wrong, missing, extra and absurd fields, and oversized frames. Used by
tests/faults/test_daemon_faults.py (a few hundred cases) and bench/daemon_faults.py (thousands).

hypothesis is imported at the top: it is a dev dependency, not a runtime one, and only the
benchmarks and the tests import this module (nothing in the runtime package does)."""

from __future__ import annotations

import msgspec
import zmq
from hypothesis import strategies as st

from specactor.server.daemon import MAX_CALL_BYTES

KINDS = ["generate", "abort", "weights_chunk", "commit_weights", "pause", "resume", "health", "stats", "heartbeat"]
FIELDS = ["call_id", "prompt_ids", "sampling_params", "request_ids", "model", "request_id", "chunk", "update_id",
          "version", "in_flight", "path", "n", "max_tokens", "temperature", "seed", "data", "shape", "total"]

_ints = st.integers(min_value=-2**63, max_value=2**64 - 1)  # what msgpack can carry
_scalars = st.none() | st.booleans() | _ints | \
    st.floats(allow_nan=True) | st.text(max_size=12) | st.binary(max_size=24)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) |
                       st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner, max_size=4),
                       max_leaves=12)
_sampling = st.dictionaries(st.sampled_from(["temperature", "top_p", "top_k", "max_tokens", "n", "seed",
                                             "stop_token_ids", "logprobs"]), _values, max_size=5)
_calls = st.fixed_dictionaries(
    {"kind": st.sampled_from(KINDS) | st.text(max_size=8)},
    optional={"call_id": _values, "prompt_ids": _values | st.lists(st.lists(_ints, max_size=6), max_size=3),
              "sampling_params": _sampling | _values, "request_ids": _values, "request_id": _values,
              "update_id": _values, "version": _values, "in_flight": _values, "path": _values,
              "chunk": st.dictionaries(st.sampled_from(["update_id", "name", "dtype", "shape", "offset", "total",
                                                        "data"]), _values, max_size=7),
              "extra": _values})


def bodies() -> st.SearchStrategy[bytes]:
    """One hostile call body."""
    return st.one_of(
        st.binary(max_size=300),
        _values.map(msgspec.msgpack.encode),
        _calls.map(msgspec.msgpack.encode),
        st.integers(min_value=1, max_value=64).map(lambda k: b"\x91" + b"\xc4" * k),  # truncated msgpack
    )


OVERSIZED = b"\x81\xa4kind" + b"\xda" + b"x" * (MAX_CALL_BYTES + 16)  # over the limit: answered, not dropped


def send_hostile(sock: zmq.Socket, body: bytes, wait_ms: int = 300) -> list[dict]:
    """Send one body on a DEALER socket; the replies that come within ``wait_ms`` (decoded)."""
    sock.send(body)
    replies = []
    while sock.poll(wait_ms if not replies else 20):
        replies.append(msgspec.msgpack.decode(sock.recv()))
    return replies


def acceptable(reply: dict) -> bool:
    """An error naming the problem, or the ordinary answer of a call that happened to be valid."""
    if reply.get("kind") == "error":
        return isinstance(reply.get("error"), str) and bool(reply["error"])
    return reply.get("kind") in ("done", "result")
