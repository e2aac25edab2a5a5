"""The engine's command-line flags, and the one function that turns them into an EngineConfig.

``specactor rollout``, ``serve`` and ``bench`` all add their engine flags with
:func:`add_engine_arguments` and read them with :func:`engine_config_from_args`,
so a setting cannot reach one command and be forgotten by another.
"""

from __future__ import annotations

import argparse
from typing import Any

from specactor.backends import check_backend
from specactor.config import BACKENDS, DRAFT_QUANTS, DTYPES, MODES, EngineConfig

#: Flags a command may leave out, because it sets the field itself (bench: mode and drafters per
#: run, seeds per epoch; rollout: max_len from its prompts).
OPTIONAL = ("mode", "drafters", "seed", "events", "max_len")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_engine_arguments(parser: argparse.ArgumentParser, *, default_mode: str = "specactor",
                         without: tuple[str, ...] = ()) -> None:
    """Add every engine flag (less those in ``without``, each one of :data:`OPTIONAL`)."""
    assert set(without) <= set(OPTIONAL), without
    group = parser.add_argument_group("engine")
    group.add_argument("--model", default=None,
                       help="registry name (default smollm2-135m) or a local Hugging Face checkpoint folder")
    if "mode" not in without:
        group.add_argument("--mode", default=default_mode, choices=MODES,
                           help="autoregressive baseline, coupled speculation, or SpecActor "
                                "(decoupled, steered by the Fastest-of-N policy)")
    if "drafters" not in without:
        group.add_argument("--drafters", default="ngram,suffix",
                           help="drafting methods for the speculative modes (coupled uses the first); add 'model' "
                                "where the model drafter gets cores of its own (GPU, or more than 2 CPU cores)")
    group.add_argument("--k", type=positive_int, default=4, help="tokens per draft proposal")
    group.add_argument("--window", type=positive_int, default=EngineConfig.window,
                       help="the most draft tokens a verify step checks per request: the policy picks 0 to this "
                            "for each request from its acceptance and the cost profile (a decoupled drafter runs "
                            "up to 2 x window + 1 tokens ahead of the last verdict); default: 16 on the torch "
                            "backend, 8 on vllm")
    group.add_argument("--max-batch", type=positive_int, default=32, help="requests decoded together")
    if "max_len" not in without:
        group.add_argument("--max-len", type=positive_int, default=1024,
                           help="longest prompt + max_tokens a request may have (sizes the KV cache)")
    group.add_argument("--no-share-prompts", action="store_true",
                       help="every sample prefills its own prompt (default: the n samples of a prompt compute it "
                            "once, the others copy it; on vllm, its prefix cache)")
    group.add_argument("--backend", default="torch", choices=BACKENDS,
                       help="the verifier's engine: torch (specactor's own) or vllm (vLLM verifies what specactor's "
                            "drafters propose; install it with `bash scripts/setup.sh --vllm`; see docs/verl.md)")
    group.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (CUDA: tested on an H200 and an H100, see docs/gpu.md)")
    group.add_argument("--dtype", default="float32", choices=DTYPES,
                       help="precision of the target's weights, activations and KV cache")
    group.add_argument("--eager", action="store_true",
                       help="on a GPU, run every step eagerly (default: decode and verify steps replay CUDA "
                            "graphs, several times faster for a small model; prefill and racing steps are eager)")
    group.add_argument("--threads", type=positive_int, default=None,
                       help="torch threads of the verifier (default: torch's own, every physical core; a model "
                            "drafter shares them unless this leaves it some)")
    if "seed" not in without:
        group.add_argument("--seed", type=int, default=0,
                           help="seed of requests that name none; sample i of request X gets the seed "
                                "derived from (seed, X, i), the same through every entry point")
    if "events" not in without:
        group.add_argument("--events", default=None, help="write structured events (JSON lines) here")
    group.add_argument("--draft-quant", default=None, choices=DRAFT_QUANTS,
                       help="the model drafter's copy of the target: llama-q8_0 / llama-q4_0 (8 / 4 bits on "
                            "llama.cpp, CPU; needs `bash scripts/setup.sh --llama-cpp`) or torch's int8w, int8, "
                            "bf16, fp32 (default: int8w on the CPU, bf16 on a GPU)")
    group.add_argument("--draft-threads", type=positive_int, default=1,
                       help="threads of the model drafter's own process")
    group.add_argument("--no-policy", action="store_true",
                       help="specactor mode without the Fastest-of-N policy: every drafter on every request")
    group.add_argument("--no-racing", action="store_true",
                       help="the policy never races a second method on tail requests")
    group.add_argument("--max-restarts", type=int, default=3,
                       help="times a crashed or hung verifier / model drafter is started again (its requests are "
                            "run again, token-identical); after that every request fails with the reason")
    group.add_argument("--max-in-flight", type=positive_int, default=16384,
                       help="samples accepted and not finished, at most: beyond it a call is refused")
    group.add_argument("--profile", default=None,
                       help="the policy's cost profile: auto (default: this machine's, measured once at start-up "
                            "and cached), cached (never measure), packaged, or a JSON file (bench/cost_profile.py)")


def add_pool_arguments(parser: argparse.ArgumentParser) -> None:
    """``--replicas`` and ``--ray-address``: run on a pool of engines on Ray (``docs/ray.md``)."""
    group = parser.add_argument_group("pool (Ray)")
    group.add_argument("--replicas", type=positive_int, default=None, metavar="N",
                       help="run N engine replicas as Ray actors (one per GPU with --device cuda; on a CPU, the "
                            "cores shared out unless --threads says): samples of one prompt run on one replica; a "
                            "dead replica's samples finish on another with the same tokens. Needs specactor[ray]")
    group.add_argument("--ray-address", default=None, metavar="ADDR",
                       help="the Ray cluster to join (auto: the one this machine is in); default: start a local one")


def engine_config_from_args(args: argparse.Namespace, **overrides: Any) -> EngineConfig:
    """The EngineConfig the flags describe (``overrides`` win); checked, ValueError naming a bad one."""
    from specactor.drafters.registry import parse_methods

    given = vars(args)
    fields: dict[str, Any] = {
        "model": args.model, "k": args.k, "window": args.window, "max_batch": args.max_batch,
        "device": args.device, "dtype": args.dtype, "verifier_threads": args.threads,
        "policy": not args.no_policy, "racing": not args.no_racing,
        "max_restarts": args.max_restarts, "max_in_flight": args.max_in_flight, "backend": args.backend,
        "share_prompts": not args.no_share_prompts,
        "cuda_graphs": not args.eager, "draft_quant": args.draft_quant, "drafter_threads": args.draft_threads,
    }
    if "mode" in given:
        fields["mode"] = args.mode
    if "drafters" in given:
        fields["drafters"] = parse_methods(args.drafters)
    if "max_len" in given:
        fields["max_len"] = args.max_len
    if "seed" in given:
        fields["seed"] = args.seed
    if "events" in given:
        fields["events_path"] = args.events
    if getattr(args, "profile", None) is not None:
        fields["profile"] = args.profile
    config = EngineConfig(**{**fields, **overrides})
    check_backend(config)
    return config
