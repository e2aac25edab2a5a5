"""Weight updates between RL steps: a state dict as raw-byte chunks, no pickle.

The sender (:func:`chunk_state_dict`) cuts every tensor into
:class:`~specactor.protocol.WeightsChunk` messages of at most ``chunk_bytes``;
the receiver (:class:`WeightStaging`) reassembles them, and
:func:`checked_update` makes sure the result fits the model before anything is
applied, so a bad update leaves the running weights untouched.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import torch

from specactor import protocol as p

if TYPE_CHECKING:
    from specactor.engine.model import CausalLM

DEFAULT_CHUNK_BYTES = 8 << 20
IN_FLIGHT = ("finish", "abort")

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
}


def check_source(state_dict: Any, path: str | None) -> None:
    """An update names exactly one source: a state dict or a checkpoint path."""
    if (state_dict is None) == (path is None):
        raise ValueError("update_weights needs exactly one of state_dict and path")


def commit_problem(in_flight: str, version: int, running: int) -> str:
    """What makes committing ``version`` over the ``running`` one impossible ('' if nothing)."""
    if in_flight not in IN_FLIGHT:
        return f"in_flight must be one of {', '.join(IN_FLIGHT)}, got {in_flight!r}"
    if version <= running:
        return f"version {version} is not newer than the running version {running}"
    return ""


def next_version(in_flight: str, version: int | None, running: int) -> int:
    """The version a commit installs (``running + 1`` unless given); ValueError naming what is wrong."""
    version = running + 1 if version is None else version
    problem = commit_problem(in_flight, version, running)
    if problem:
        raise ValueError(problem)
    return version


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"weights of dtype {name} cannot be sent: use one of {', '.join(DTYPES)}")
    return name


def chunk_state_dict(update_id: str, state_dict: Mapping[str, torch.Tensor],
                     chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[p.WeightsChunk]:
    """The chunks of ``state_dict`` (any device; sent as CPU little-endian bytes)."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"weight {name!r} is a {type(tensor).__name__}, not a tensor")
        dtype = dtype_name(tensor.dtype)
        raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        total = raw.nbytes
        for offset in range(0, max(total, 1), chunk_bytes):
            yield p.WeightsChunk(update_id=update_id, name=name, dtype=dtype, shape=list(tensor.shape),
                                 offset=offset, total=total, data=raw[offset:offset + chunk_bytes].tobytes())


class WeightStaging:
    """Reassembles the chunks of one update; every inconsistency is a ValueError naming it.

    ``expected``: the model's weight names and shapes. A chunk is checked against them
    before its tensor's buffer is allocated, so a message declaring a 50 GB tensor is
    refused, not obeyed."""

    def __init__(self, expected: Mapping[str, tuple[int, ...]] | None = None) -> None:
        self._buffers: dict[str, tuple[str, tuple[int, ...], bytearray, int]] = {}  # name -> dtype, shape, buf, got
        self.expected = expected

    def add(self, chunk: p.WeightsChunk) -> None:
        name = chunk.name
        if self.expected is not None and name not in self._buffers:
            if name not in self.expected:
                raise ValueError(f"weight {name!r} is not a weight of this model")
            if tuple(chunk.shape) != tuple(self.expected[name]):
                raise ValueError(f"weight {name!r} has shape {list(chunk.shape)}, the model needs "
                                 f"{list(self.expected[name])}")
        if chunk.dtype not in DTYPES:
            raise ValueError(f"weight {name!r}: unknown dtype {chunk.dtype!r} (use one of {', '.join(DTYPES)})")
        if any(n < 0 for n in chunk.shape):
            raise ValueError(f"weight {name!r}: negative dimension in shape {chunk.shape}")
        shape = tuple(chunk.shape)
        expected = DTYPES[chunk.dtype].itemsize * _numel(shape)
        if chunk.total != expected:
            raise ValueError(f"weight {name!r}: total {chunk.total} bytes does not match {chunk.dtype} "
                             f"{list(shape)} ({expected} bytes)")
        if name not in self._buffers:
            self._buffers[name] = (chunk.dtype, shape, bytearray(chunk.total), 0)
        dtype, known_shape, buf, got = self._buffers[name]
        if (dtype, known_shape) != (chunk.dtype, shape):
            raise ValueError(f"weight {name!r}: chunks disagree on dtype/shape ({dtype} {list(known_shape)} "
                             f"vs {chunk.dtype} {list(shape)})")
        end = chunk.offset + len(chunk.data)
        if chunk.offset < 0 or end > len(buf):
            raise ValueError(f"weight {name!r}: chunk at bytes {chunk.offset}..{end} is outside its "
                             f"{len(buf)} bytes")
        buf[chunk.offset:end] = chunk.data
        self._buffers[name] = (dtype, shape, buf, got + len(chunk.data))

    @property
    def nbytes(self) -> int:
        return sum(len(buf) for _, _, buf, _ in self._buffers.values())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The reassembled tensors; ValueError if any tensor is incomplete."""
        out = {}
        for name, (dtype, shape, buf, got) in self._buffers.items():
            if got != len(buf):
                raise ValueError(f"weight {name!r}: received {got} of {len(buf)} bytes")
            out[name] = torch.frombuffer(buf, dtype=torch.uint8).view(DTYPES[dtype]).reshape(shape) if buf \
                else torch.empty(shape, dtype=DTYPES[dtype])
        return out


class PendingUpdates:
    """The chunks of every update received but not yet committed, by update id, as an actor
    that holds weights keeps them. A bad chunk is remembered and reported at the commit.

    An update whose sender went away is never committed: one that received no chunk for
    ``stale_after_s`` is dropped (its memory freed; a late commit is told why)."""

    MAX_ERRORS = 64  # what was wrong with the last updates, for their commits

    def __init__(self, expected: Mapping[str, tuple[int, ...]] | None = None, stale_after_s: float = 600.0) -> None:
        self._staging: dict[str, WeightStaging] = {}
        self._errors: OrderedDict[str, str] = OrderedDict()  # update id -> what was wrong with one of its chunks
        self._touched: dict[str, float] = {}  # update id -> when its last chunk came
        self.expected = expected  # the model's weight shapes, once known
        self.stale_after_s = stale_after_s

    @property
    def staged_bytes(self) -> int:
        return sum(s.nbytes for s in self._staging.values())

    def add(self, chunk: p.WeightsChunk) -> None:
        self.expire()
        if chunk.update_id in self._errors:
            return
        self._touched[chunk.update_id] = time.monotonic()
        try:
            staging = self._staging.get(chunk.update_id)
            if staging is None:
                staging = self._staging[chunk.update_id] = WeightStaging(self.expected)
            staging.add(chunk)
        except ValueError as exc:
            self._fail(chunk.update_id, str(exc))

    def expire(self) -> None:
        """Drop the updates that have had no chunk for ``stale_after_s``."""
        now = time.monotonic()
        for update_id, last in list(self._touched.items()):
            if now - last > self.stale_after_s:
                self._fail(update_id, f"update {update_id!r} expired: no chunk for {self.stale_after_s:g} s")

    def _fail(self, update_id: str, error: str) -> None:
        self._staging.pop(update_id, None)
        self._touched.pop(update_id, None)
        self._errors[update_id] = error
        while len(self._errors) > self.MAX_ERRORS:
            self._errors.popitem(last=False)

    def take(self, commit: p.WeightsCommit) -> tuple[Callable[[], dict[str, torch.Tensor]], str]:
        """Forget the update; return a loader of its weights (the checkpoint at ``commit.path``,
        else its chunks; run it off the event loop) and what was wrong with its chunks ('' if
        nothing)."""
        staging = self._staging.pop(commit.update_id, None) or WeightStaging()
        self._touched.pop(commit.update_id, None)
        error = self._errors.pop(commit.update_id, "")
        if commit.path:
            return lambda: read_checkpoint(commit.path), error
        return staging.state_dict, error


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """Weights from a ``.safetensors`` file or a folder of them."""
    from safetensors.torch import load_file

    from specactor.engine.weights import load_state_dict

    path = Path(path)
    if path.is_dir():
        return load_state_dict(path)
    if path.suffix == ".safetensors" and path.is_file():
        return load_file(path)
    raise FileNotFoundError(f"checkpoint {path} is neither a .safetensors file nor a folder of them")


def checked_update(model: "CausalLM", state: Mapping[str, torch.Tensor]) -> None:
    """Raise ValueError unless ``state`` holds every weight ``model`` reads, with its shape,
    and nothing else (``lm_head.weight`` is optional when the embeddings are tied)."""
    expected = model.hf_shapes()
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise ValueError(f"update has {len(unknown)} unknown weight(s), e.g. {unknown[0]!r}")
    optional = {"lm_head.weight"} if model.cfg.tie_word_embeddings else set()
    missing = sorted(set(expected) - set(state) - optional)
    if missing:
        raise ValueError(f"update is missing {len(missing)} weight(s), e.g. {missing[0]!r}: send the whole "
                         f"state dict")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name]):
            raise ValueError(f"weight {name!r} has shape {list(tensor.shape)}, the model needs "
                             f"{list(expected[name])}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ValueError(f"weight {name!r} holds NaN or infinite values")
