"""This machine's cost profile: how long a forward of the target takes, by batch size and chunk length.

The policy decides where speculation pays from the ratio of a verify step to a
decode step at each batch size, and that ratio depends on the CPU far more
than a scalar correction can fix (prepacked weights on an AVX2 EPYC: verifying
4 drafted tokens at batch 1 costs 1.3x a decode step, at batch 12 2.5x, and a
single drafting row in a batch of 12 adds a third of a decode step). So the
profile is measured on the machine that serves, once, and cached.

:func:`measure` times forwards of a CausalLM with its weights packed as the
engine packs them (``model.pack()``): for each batch size B and chunk length
C, the rows have ``context`` tokens in their KV cache on average (spread over
+-25% when B > 1, as a rollout's rows differ) and are fed C new tokens
(C=1 is a decode step, C=k+1 verifies k drafted tokens), logits for every
position, as verification needs; and, for B > 1, one row fed C tokens while the
others decode (``one_row_s``), and half the rows (B // 2) fed C tokens (``half_rows_s``:
past a few drafting rows the engine pads every row to the longest chunk, so a step's
cost is far from linear in its drafting rows). The median of ``repeats`` timed forwards is kept,
after one warm-up. ``bench/cost_profile.py`` is its command line.

:func:`ensure_profile` is what the engine calls where the model is loaded
(the verifier's process, before it serves): the cached profile for this
machine, else a quick one measured now (:data:`QUICK`'s batch sizes, chunks up to the
engine's window + 1 (:func:`grid_for`), about 20-40 s for the default model on a 2-core CPU)
and cached. The cache key is the model's folder
name, dtype, device, torch's thread count, the CPU model and torch's version
(:func:`profile_key`); files live in ``<cache>/profiles/`` (see
:func:`specactor.engine.model_registry.cache_dir`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

#: Bumped when what is measured changes, so that older cached profiles are re-measured.
#: 2: rows of a batch hold contexts of different lengths, as in a rollout (version 1 gave every row
#: the same length, which let a batch of decode rows skip the attention mask a live step builds).
#: 3: half the rows fed a chunk (``half_rows_s``), the third point of a step's cost by drafting rows.
PROFILE_VERSION = 3

#: the smallest batch whose half-rows figure is a point of its own (``batch // 2`` rows, at least 2);
#: below it the profiles store the one-row figure there, and the cost model does not use it
HALF_ROWS_FROM = 4


@dataclass
class ProfileTables:
    """A profile's timings, checked: seconds by batch size (rows) and chunk length (columns)."""

    batch_sizes: list[int]
    chunk_lens: list[int]
    forward_s: list[list[float]]
    one_row_s: list[list[float]] | None = None
    half_rows_s: list[list[float]] | None = None


#: A step's time grows at most about as fast as its work (rows x tokens fed). A cached profile in
#: which it grows more than this many times faster from one grid point to the next was measured
#: while something else took the cores: one on the 2-core machine said 226 ms for a batch-32
#: decode step that takes 58 and 1.9 s for 8 tokens a row, and the policy, pricing drafts by it,
#: drafted on nearly every batch-32 step of a T=1 rollout (0.89x where a clean profile gave 0.98x).
IMPLAUSIBLE_JUMP = 2.0
#: ... by more than this much: a tiny model's sub-millisecond steps jump by more than that ratio
#: with the machine's noise alone (0.7 ms at batch 1, 3.0 ms at batch 2), and cost the policy nothing
IMPLAUSIBLE_SLACK_S = 0.005


def implausible(tables: "ProfileTables") -> str:
    """Why ``tables`` cannot be a quiet machine's (a step time that jumps more than
    IMPLAUSIBLE_JUMP times faster than its work, and by more than IMPLAUSIBLE_SLACK_S, between
    neighbouring batch sizes or chunks), or ""."""
    sizes, chunks, forward = tables.batch_sizes, tables.chunk_lens, tables.forward_s

    def over(seconds: float, bound: float) -> bool:
        return seconds > IMPLAUSIBLE_JUMP * bound + IMPLAUSIBLE_SLACK_S

    for i in range(len(sizes)):
        for j in range(len(chunks)):
            if i and over(forward[i][j], forward[i - 1][j] * sizes[i] / sizes[i - 1]):
                return (f"{chunks[j]} token(s) a row: {forward[i - 1][j] * 1e3:.1f} ms at batch {sizes[i - 1]}, "
                        f"{forward[i][j] * 1e3:.1f} ms at batch {sizes[i]}")
            if j and over(forward[i][j], forward[i][j - 1] * chunks[j] / chunks[j - 1]):
                return (f"batch {sizes[i]}: {forward[i][j - 1] * 1e3:.1f} ms for {chunks[j - 1]} token(s) a row, "
                        f"{forward[i][j] * 1e3:.1f} ms for {chunks[j]}")
    return ""


def check_profile(text: str, name: str) -> ProfileTables:
    """The tables of the profile in ``text`` (JSON, as :func:`measure` writes it), or ValueError
    naming the profile (``name``) and what is wrong with it."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"cost profile {name} is not JSON: {exc}") from None
    return check_profile_data(data, name)


def check_profile_data(data: Any, name: str) -> ProfileTables:
    """:func:`check_profile` of a profile already parsed from JSON."""
    if not isinstance(data, dict):
        raise ValueError(f"cost profile {name} is not a JSON object")

    def table(field_name: str) -> list[list[float]]:
        try:
            return [list(map(float, row)) for row in data[field_name]]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"cost profile {name} has a malformed table: {exc}") from None

    try:
        tables = ProfileTables(list(data["batch_sizes"]), list(data["chunk_lens"]), table("forward_s"))
    except KeyError as exc:
        raise ValueError(f"cost profile {name} lacks the field {exc}") from None
    except TypeError as exc:
        raise ValueError(f"cost profile {name} has a malformed table: {exc}") from None

    def check(rows: list[list[float]], field_name: str) -> None:
        if len(rows) != len(tables.batch_sizes) or any(len(row) != len(tables.chunk_lens) for row in rows):
            raise ValueError(f"cost profile {name}: {field_name} is not batch_sizes x chunk_lens")
        if any(not (t > 0 and math.isfinite(t)) for row in rows for t in row):
            raise ValueError(f"cost profile {name}: {field_name} holds a time that is not a positive number")

    if not tables.batch_sizes or not tables.chunk_lens:
        raise ValueError(f"cost profile {name}: batch_sizes and chunk_lens must not be empty")
    if tables.batch_sizes != sorted(set(tables.batch_sizes)) or tables.chunk_lens != sorted(set(tables.chunk_lens)):
        raise ValueError(f"cost profile {name}: batch_sizes and chunk_lens must increase")
    check(tables.forward_s, "forward_s")
    for field_name in ("one_row_s", "half_rows_s"):
        if data.get(field_name) is not None:
            rows = table(field_name)
            check(rows, field_name)
            setattr(tables, field_name, rows)
    if tables.half_rows_s is not None and tables.one_row_s is None:
        raise ValueError(f"cost profile {name}: half_rows_s needs one_row_s")
    return tables


@dataclass(frozen=True)
class Grid:
    batch_sizes: tuple[int, ...]
    chunk_lens: tuple[int, ...]
    context: int
    repeats: int


#: The start-up grid: small enough to take well under the actor system's 120 s ready timeout.
QUICK = Grid(batch_sizes=(1, 2, 4, 8, 16, 32), chunk_lens=(1, 2, 4, 8), context=256, repeats=2)


def grid_for(window: int) -> Grid:
    """The start-up grid with the engine's longest chunk (window + 1) measured too, and nothing
    longer: the policy prices a long window from timings, not from a linear extrapolation past
    chunk 8 (on the 2-core CPU that put our engine's chunk 17 6-19% above two timings of it at
    batch 8-32; on vLLM a long window pays at small batches and not at large ones). Nothing
    longer, because vLLM cannot verify it (and a cache checked against it would never do); so a
    window below 7 caches a profile without chunk 8, which a later run with a longer window
    measures again."""
    longest = max(window, 0) + 1
    return replace(QUICK, chunk_lens=tuple(sorted({c for c in QUICK.chunk_lens if c < longest} | {longest})))


#: Measuring stops after this many seconds (the batch sizes measured so far are kept: the
#: cost model extrapolates beyond them); the verifier must acknowledge the directory within 120 s.
DEFAULT_BUDGET_S = 75.0


def cpu_model() -> str:
    """The CPU's model string: /proc/cpuinfo's "model name" (Linux), else platform's."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def profile_key(model: str | os.PathLike[str], dtype: str, device: str, threads: int | None = None,
                backend: str = "torch") -> dict[str, Any]:
    """What a cached profile must match: model folder name, dtype, device, torch threads, CPU, torch,
    and the verifier backend when it is not our eager engine (vLLM's steps cost what vLLM's cost;
    ``torch-cuda-graphs``, our engine's steps replayed as CUDA graphs, cost several times less)."""
    import torch

    name = Path(model).name  # a registry name or a checkpoint folder: the folder's name
    gpu = ""
    if str(device).startswith("cuda") and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(torch.device(device))
    key = {"model": name, "dtype": str(dtype).removeprefix("torch."), "device": str(device),
           "threads": int(threads if threads is not None else torch.get_num_threads()),
           "cpu": cpu_model(), "gpu": gpu, "cores": os.cpu_count() or 0, "torch": torch.__version__,
           "version": PROFILE_VERSION}
    if backend != "torch":  # our engine's keys stay what they were: cached profiles remain valid
        key["backend"] = backend  # (the vLLM backend runs only on the vLLM version it pins)
    return key


def profiles_dir() -> Path:
    from specactor.engine.model_registry import cache_dir

    return cache_dir() / "profiles"


def profile_path(key: dict[str, Any]) -> Path:
    """Where the profile for ``key`` is cached (readable prefix, hash of the whole key)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    slug = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in
                   f"{key['model']}-{key['dtype']}-{key['device']}-t{key['threads']}")
    return profiles_dir() / f"{slug}-{digest}.json"


def load_cached(path: Path, key: dict[str, Any], min_chunk: int = 0) -> tuple[bool, str]:
    """(usable, why not): the file exists, is a valid profile, was measured for ``key`` and, when
    ``min_chunk`` is given, over chunks up to at least that many tokens a row (a window priced by
    extrapolation past the measured chunks is where the policy went wrong before)."""
    if not path.is_file():
        return False, "absent"
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            return False, "not a JSON object"
        if data.get("key") != key:
            return False, "measured for another key"
        odd = implausible(check_profile_data(data, str(path)))
        if odd:
            return False, f"implausible, measured while the machine was busy? ({odd})"
        measured = max(data.get("chunk_lens") or [0])
        if measured < min_chunk:
            return False, f"measured chunks up to {measured} tokens a row, the window needs {min_chunk}"
    except (OSError, ValueError) as exc:
        return False, str(exc)
    return True, ""


def find_profile(model: str | os.PathLike[str], dtype: str, device: str, threads: int | None = None,
                 backend: str = "torch") -> Path | None:
    """This machine's cached profile for that model, setting and backend, or None (absent or unusable)."""
    key = profile_key(model, dtype, device, threads, backend)
    path = profile_path(key)
    ok, _ = load_cached(path, key)
    return path if ok else None


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)


def row_contexts(context: int, rows: int) -> list[int]:
    """Context lengths of a measured batch's rows: ``context`` on average, spread evenly over +-25%.
    Equal lengths would let a batch of decode rows skip the attention mask that every live step of
    a rollout builds (its rows started at different times): 5-15% of a CPU step at batch 4-32 (~2%
    of a GPU step), which made drafting look that much dearer against decoding."""
    if rows == 1:
        return [context]
    spread = context // 4
    return [context - spread + (2 * spread * i) // (rows - 1) for i in range(rows)]


def measure(model: Any, batch_sizes: Any = QUICK.batch_sizes, chunk_lens: Any = QUICK.chunk_lens,
            context: int = QUICK.context, repeats: int = QUICK.repeats, *, one_row: bool = True,
            half_rows: bool = True,
            sample: bool = False, budget_s: float | None = None,
            progress: Callable[[str], None] | None = None, cuda_graphs: bool = False) -> dict[str, Any]:
    """Time forwards of ``model`` (a :class:`specactor.engine.model.CausalLM`, packed here as
    the engine packs it) over ``batch_sizes`` x ``chunk_lens`` with ``context`` tokens of KV cache
    per row; return the profile (the JSON format :class:`CostModel` reads).

    ``one_row`` and ``half_rows`` time one row and half the rows (``batch // 2``) fed each chunk
    while the others decode (``one_row_s``, ``half_rows_s``; the half-rows figure is interpolated
    from the one-row one, so it brings that along);
    ``sample`` also times the sampler for every position (``sample_s``, informative only);
    ``budget_s`` stops after the batch size during which it ran out (the profile then
    holds the batch sizes measured, and ``"partial": true``). ``cuda_graphs`` times the steps as
    the engine replays them on a GPU (:mod:`specactor.engine.cuda_graphs`: padded, captured at
    the warm-up run).
    """
    import torch

    from specactor.engine.cuda_graphs import GraphedSteps
    from specactor.engine.kv_cache import KVCache
    from specactor.engine.sampler import SamplingBatch, sample as sample_logits

    batch_sizes, chunk_lens = sorted(set(int(b) for b in batch_sizes)), sorted(set(int(c) for c in chunk_lens))
    if not batch_sizes or not chunk_lens or batch_sizes[0] < 1 or chunk_lens[0] < 1 or repeats < 1:
        raise ValueError("need batch sizes and chunk lengths >= 1 and repeats >= 1")
    packed = model.pack() if hasattr(model, "pack") else False  # what the engine runs (a no-op if packed)
    weight = model.embed.weight
    device, dtype, vocab = weight.device, weight.dtype, model.cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    longest = max(max(row_contexts(context, b)) for b in batch_sizes)
    cache = KVCache(model.cfg, max(batch_sizes), longest + max(chunk_lens) + 1, dtype=dtype, device=device)
    # the context's keys and values: their values do not change a forward's time, so no prefill
    gen = torch.Generator(device=device).manual_seed(0) if device.type == "cuda" else g
    for t in (cache.k, cache.v):
        t[:, :, :, :longest].normal_(generator=gen)

    graphs = GraphedSteps(model, cache) if cuda_graphs else None

    def step(tokens: torch.Tensor, q_lens: list[int]) -> torch.Tensor:
        shape = graphs.shape(q_lens, cache.lengths[:len(q_lens)]) if graphs is not None else None
        if shape is None:
            return model(tokens.to(device), q_lens, cache)
        assert graphs is not None
        return graphs.run([row.tolist() for row in tokens.split(q_lens)], list(range(len(tokens))), shape)

    sampling: list[list[float]] = []  # the sampler's time for every row's positions, by batch and chunk

    class Timer:
        """Forwards of ``batch`` rows, ``rows`` of them fed a chunk and the others one token."""

        def __init__(self, batch: int) -> None:
            self.batch = batch
            self.sample_s: list[float] = []

        def time(self, chunk: int, rows: int) -> float:
            q_lens = [chunk] * rows + [1] * (self.batch - rows)
            b, fed = len(q_lens), sum(q_lens)
            times, stimes = [], []
            for r in range(repeats + 1):
                tokens = torch.randint(0, vocab, (fed,), generator=g)
                tokens = tokens if graphs is not None else tokens.to(device)  # a graphed step takes host lists
                cache.lengths[:b] = row_contexts(context, b)
                _sync(device)
                t0 = time.perf_counter()
                logits = step(tokens, q_lens)
                _sync(device)
                t1 = time.perf_counter()
                if sample:
                    rows_ = [(1.0, 0, 1.0, i, cache.lengths[i] + j) for i, q in enumerate(q_lens) for j in range(q)]
                    sample_logits(logits, SamplingBatch.build(rows_, device))
                    _sync(device)
                t2 = time.perf_counter()
                if r:  # the first run is a warm-up
                    times.append(t1 - t0)
                    stimes.append(t2 - t1)
            if rows == self.batch:
                self.sample_s.append(statistics.median(stimes))
            return statistics.median(times)

        def note(self) -> str:
            return f"  sample {self.sample_s[-1] * 1000:6.1f} ms" if sample else ""

        def close(self) -> bool:
            sampling.append(self.sample_s)
            return True

    with torch.inference_mode():
        timings = sweep_grid(batch_sizes, chunk_lens, Timer, one_row=one_row, half_rows=half_rows,
                             budget_s=budget_s, progress=progress)
    cache.lengths = [0] * cache.num_slots
    result: dict[str, Any] = {
        "model": getattr(model.cfg, "name", "") or "", "context": context, "threads": torch.get_num_threads(),
        "repeats": repeats, "packed": bool(packed), "dtype": str(dtype).removeprefix("torch."), "device": str(device),
        **timings.fields(),
    }
    if not (one_row or half_rows):
        del result["one_row_s"]
    if not half_rows:
        del result["half_rows_s"]
    if sample:
        result["sample_s"] = sampling  # one row per batch size timed (every one opened is kept)
    return result


class BatchTimer(Protocol):
    """Times the steps of one batch size for :func:`sweep_grid` (each backend has its own)."""

    def time(self, chunk: int, rows: int) -> float:
        """Seconds of a step in which ``rows`` of the batch are fed ``chunk`` tokens and the others one."""

    def note(self) -> str:
        """Anything to add to the progress line of the chunk just timed."""

    def close(self) -> bool:
        """Release the batch; False where its timings must not be kept."""


@dataclass
class GridTimings:
    """A sweep's timings, by batch size (rows) and chunk length (columns), in the profile's format."""

    batch_sizes: list[int]
    chunk_lens: list[int]
    forward_s: list[list[float]]
    one_row_s: list[list[float]]
    half_rows_s: list[list[float]]
    partial: bool
    seconds: float

    def fields(self) -> dict[str, Any]:
        """The profile's fields these timings give (``partial`` only where it ran out or left some out)."""
        import torch

        out: dict[str, Any] = {
            "batch_sizes": self.batch_sizes, "chunk_lens": self.chunk_lens, "forward_s": self.forward_s,
            "one_row_s": self.one_row_s, "half_rows_s": self.half_rows_s,
            "date": time.strftime("%Y-%m-%d"), "measure_s": round(self.seconds, 3),
            "machine": f"{platform.machine()} {os.cpu_count()} cores, {cpu_model()}, torch {torch.__version__}",
        }
        if self.partial:
            out["partial"] = True
        return out


def sweep_grid(batch_sizes: list[int], chunk_lens: list[int], open_batch: Callable[[int], BatchTimer], *,
               one_row: bool = True, half_rows: bool = True, budget_s: float | None = None,
               progress: Callable[[str], None] | None = None, label: str = "") -> GridTimings:
    """The profile's grid, timed the same way on either backend: for each batch size (opened with
    ``open_batch``) and chunk length, a step with every row fed the chunk, then (for B > 1 and
    C > 1) one row and, from :data:`HALF_ROWS_FROM` rows, half of them (``one_row`` and
    ``half_rows`` turn those off; a figure not timed is the one before it). Stops after the batch
    size during which ``budget_s`` ran out; a batch whose timer says so on closing is left out.
    Both make the timings ``partial``."""
    started = time.perf_counter()
    forward: list[list[float]] = []
    one: list[list[float]] = []
    half: list[list[float]] = []
    done: list[int] = []
    partial = False
    for b in batch_sizes:
        if budget_s is not None and done and time.perf_counter() - started > budget_s:
            partial = True
            break
        timer = open_batch(b)
        f_row, o_row, h_row = [], [], []
        try:
            for c in chunk_lens:
                f = timer.time(c, b)
                o = f if (b == 1 or c == 1) or not (one_row or half_rows) else timer.time(c, 1)
                h = o if b < HALF_ROWS_FROM or c == 1 or not half_rows else timer.time(c, b // 2)
                f_row.append(f)
                o_row.append(o)
                h_row.append(h)
                if progress is not None:
                    progress(f"{label}B={b:3d} C={c:2d}: step {f * 1000:8.1f} ms  one row {o * 1000:8.1f} ms"
                             + (f"  half the rows {h * 1000:8.1f} ms" if half_rows else "") + timer.note())
        finally:
            kept = timer.close()
        if not kept:
            partial = True
            if progress is not None:
                progress(f"{label}B={b:3d}: a row reached its token limit while timed; batch size left out")
            continue
        forward.append(f_row)
        one.append(o_row)
        half.append(h_row)
        done.append(b)
    return GridTimings(done, list(chunk_lens), forward, one, half, partial, time.perf_counter() - started)


def write_profile(path: str | os.PathLike[str], profile: dict[str, Any]) -> Path:
    """Write atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(profile, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One measurement at a time on this machine: two engines starting together would
    disturb each other's timings (the second then finds the first one's profile)."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with open(directory / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_profile(model: Any, model_dir: str | os.PathLike[str], *, dtype: str = "float32", device: str = "cpu",
                   threads: int | None = None, measure_missing: bool = True, grid: Grid = QUICK,
                   budget_s: float | None = DEFAULT_BUDGET_S, log: Any = None,
                   announce: Callable[[str], None] | None = None, backend: str = "torch",
                   measurer: Callable[..., dict[str, Any]] | None = None) -> Path | None:
    """The path of this machine's cost profile for ``model`` (loaded from ``model_dir``):
    the cached one, else one measured now and cached (None when it is missing and
    ``measure_missing`` is False: the policy then falls back to the packaged profile).

    Call it where the engine runs, before it serves (the timings must not share the
    cores with rollouts). ``measurer`` times another backend's engine (``model`` is then
    that engine; :func:`specactor.vllm_backend.profiling.measure_vllm`) with :func:`measure`'s
    arguments; its profile is cached under ``backend``. A cached file that cannot be used (corrupt, another key,
    chunks shorter than ``grid``'s longest) is measured again, with a warning. Emits ``policy.profile`` (path, seconds, cached)
    and, when it measures, prints one line saying so.
    """
    from specactor.events import get_logger

    log = log if log is not None else get_logger(actor="profiling")
    key = profile_key(model_dir, dtype, device, threads, backend)
    path = profile_path(key)
    min_chunk = max(grid.chunk_lens)
    ok, why = load_cached(path, key, min_chunk)
    if ok:
        log.info("policy.profile", path=str(path), seconds=0.0, cached=True)
        return path
    if why != "absent":
        log.warning("policy.profile_unusable", path=str(path), error=why)
    if not measure_missing:
        return None
    with _locked(path.parent):
        ok, _ = load_cached(path, key, min_chunk)  # measured meanwhile by another engine
        if ok:
            log.info("policy.profile", path=str(path), seconds=0.0, cached=True)
            return path
        t0 = time.perf_counter()
        for attempt in range(2):  # once more if something else took the cores meanwhile
            profile = (measurer or measure)(model, grid.batch_sizes, grid.chunk_lens, grid.context, grid.repeats,
                                            budget_s=budget_s)
            odd = implausible(check_profile_data(profile, str(path)))
            if not odd:
                break
            log.warning("policy.profile_unusable", path=str(path), error=f"implausible, measured again ({odd})")
        seconds = time.perf_counter() - t0
        profile.update(model=key["model"], key=key)
        write_profile(path, profile)
    threads = f"{key['threads']} torch thread{'s' if key['threads'] != 1 else ''}"
    line = (f"specactor: measured the cost profile of {key['model']}{f' ({backend})' if backend != 'torch' else ''}"
            f" on this machine once, in {seconds:.1f} s "
            f"({threads}, {key['cpu']}); cached in {path}")
    (announce or (lambda text: print(text, file=sys.stderr, flush=True)))(line)
    log.info("policy.profile", path=str(path), seconds=round(seconds, 3), cached=False)
    return path


def resolve_profile(setting: str | None, model_dir: str | os.PathLike[str], *, dtype: str, device: str,
                    threads: int | None, backend: str = "torch") -> str:
    """What the policy loads for ``EngineConfig.profile``: None ("auto") and "cached" give this
    machine's cached profile if there is one, "packaged" and a missing cache the packaged one,
    anything else is a path."""
    if setting not in (None, "auto", "cached"):
        return str(setting)
    found = find_profile(model_dir, dtype, device, threads, backend)
    return str(found) if found is not None else "packaged"
