"""How long a weight update between RL steps takes, on the default model (540 MB fp32).

    python bench/weight_update.py [--repeats 3]

Side by side, medians of ``--repeats``: ``RolloutEngine.update_weights`` with a
state dict (chunked raw bytes to the verifier process over ipc) and with a
checkpoint path (the verifier reads the safetensors itself), and
``RolloutClient.update_weights`` with a state dict through a ``specactor
serve`` daemon on loopback tcp. Each update is followed by a 1-token request,
so the time includes the new weights being in use. Writes
bench/results/weight_update.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from specactor import EngineConfig, RolloutClient, RolloutEngine, SamplingParams
from specactor.engine.model_registry import resolve_model
from specactor.cli.serve import DaemonProcess
from specactor.engine.weights import load_state_dict

ONE_TOKEN = SamplingParams(max_tokens=1, seed=0)


async def timed(update, probe) -> float:
    t0 = time.perf_counter()
    await update()
    await probe([[1, 2, 3]], ONE_TOKEN)
    return time.perf_counter() - t0


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "weight_update.json"))
    args = parser.parse_args()
    folder = resolve_model(None)
    state = load_state_dict(folder)
    size_mb = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    times: dict[str, list[float]] = {"engine, state dict": [], "engine, checkpoint path": [],
                                     "daemon via client, state dict": []}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt"
        ckpt.mkdir()
        for f in folder.iterdir():
            if f.is_file() and f.suffix != ".safetensors":
                shutil.copy(f, ckpt / f.name)
        save_file({k: v.contiguous() for k, v in state.items()}, ckpt / "model.safetensors")
        async with RolloutEngine(EngineConfig(mode="autoregressive", max_len=256, max_batch=4)) as engine:
            await engine.generate([[1, 2, 3]], ONE_TOKEN)
            for _ in range(args.repeats):
                times["engine, state dict"].append(await timed(lambda: engine.update_weights(state),
                                                               engine.generate))
                times["engine, checkpoint path"].append(await timed(lambda: engine.update_weights(path=str(ckpt)),
                                                                    engine.generate))
        daemon = DaemonProcess.start("--mode", "autoregressive", "--max-len", "256", "--max-batch", "4")
        try:
            async with RolloutClient(daemon.endpoint, timeout_s=300) as client:
                await client.generate([[1, 2, 3]], ONE_TOKEN)
                for _ in range(args.repeats):
                    times["daemon via client, state dict"].append(
                        await timed(lambda: client.update_weights(state), client.generate))
        finally:
            daemon.stop()
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {os.cpu_count()} cores, "
              f"torch {torch.__version__}", "weights_mb": round(size_mb), "repeats": args.repeats,
              "seconds": {k: {"median": statistics.median(v), "runs": v} for k, v in times.items()}}
    print(f"| how | median seconds ({size_mb:.0f} MB fp32, update + 1-token request) | MB/s |")
    print("|---|---|---|")
    for how, row in result["seconds"].items():
        print(f"| {how} | {row['median']:.2f} | {size_mb / row['median']:.0f} |")
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
