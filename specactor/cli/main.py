"""The ``specactor`` command line."""

from __future__ import annotations

import argparse
import sys

from specactor import __version__
from specactor.cli.engine_flags import add_engine_arguments, add_pool_arguments, positive_int


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults in the help, except a None default: those options are resolved later
    (per backend, per mode) and their help says how; "(default: None)" would contradict it.
    The bench scripts under bench/ use it too."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def _events_catalogue(args: argparse.Namespace) -> int:
    from specactor.events import catalogue_markdown

    sys.stdout.write(catalogue_markdown())
    return 0


def _events_summarize(args: argparse.Namespace) -> int:
    from specactor.event_log import at_version, format_summary, read_event_files, summarize

    try:
        events = read_event_files(args.events_file)
        if args.version is not None:
            events = at_version(events, args.version)
        print(format_summary(summarize(events)))
    except (OSError, ValueError) as exc:
        print(f"specactor events summarize: {exc}", file=sys.stderr)
        return 2
    return 0


def _events_plot(args: argparse.Namespace) -> int:
    from specactor.event_log import plot, read_events

    try:
        out = plot(read_events(args.events_file), args.out)
    except ImportError:
        print("specactor events plot needs matplotlib: pip install 'specactor[plot]'", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"specactor events plot: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


def _rollout(args: argparse.Namespace) -> int:
    from specactor.cli.engine_flags import engine_config_from_args
    from specactor.prompts import PromptFileError
    from specactor.cli.rollout import RolloutOptions, run_rollout

    try:
        opts = RolloutOptions(
            prompts=args.prompts, out=args.out, engine=engine_config_from_args(args),
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens, n=args.n,
            chat=not args.no_chat, progress=False if args.no_progress else None, resume=args.resume,
            replicas=args.replicas, ray_address=args.ray_address)
        run_rollout(opts)
    except (PromptFileError, ValueError, FileNotFoundError, NotImplementedError, RuntimeError, ImportError) as exc:
        print(f"specactor rollout: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _serve(args: argparse.Namespace) -> int:
    from specactor.cli.engine_flags import engine_config_from_args
    from specactor.cli.serve import ServeOptions, run_daemon

    try:
        return run_daemon(ServeOptions(engine_config_from_args(args), endpoint=args.endpoint,
                                       client_timeout_s=args.client_timeout, drain_timeout_s=args.drain_timeout,
                                       server_key=args.server_key, client_keys=args.client_keys,
                                       insecure=args.insecure, weights_dirs=tuple(args.weights_dir),
                                       replicas=args.replicas, ray_address=args.ray_address))
    except (ValueError, FileNotFoundError, OSError, ImportError) as exc:
        print(f"specactor serve: error: {exc}", file=sys.stderr)
        return 2


def _add_serve(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve",
        help="run a rollout daemon that RolloutClient talks to (ZeroMQ, loopback by default)",
        description="Load the model once and serve rollouts to RolloutClient over ZeroMQ: generate / stream "
        "(token ids, log-probs, finish reason), abort, update_weights (state dict or checkpoint path; bumps the "
        "policy version every result carries), pause / resume, health and stats. Every bad call gets an error "
        "naming the problem; a client that disappears has its requests aborted; SIGTERM drains running requests "
        "(up to --drain-timeout), aborts the rest and delivers every result before exiting.",
        formatter_class=HelpFormatter,
    )
    serve.add_argument("--endpoint", default="tcp://127.0.0.1:5557",
                       help="ZeroMQ endpoint to bind (tcp://HOST:PORT, port 0 = any free port; ipc://PATH). One "
                            "other machines can reach needs --server-key and --client-keys, or --insecure")
    serve.add_argument("--server-key", metavar="NAME.key_secret",
                       help="the daemon's key pair (specactor keys makes one): serve only clients whose public key "
                            "is in --client-keys (ZeroMQ CURVE); any other gets no reply")
    serve.add_argument("--client-keys", metavar="DIR", help="the folder of the clients' public keys (NAME.key)")
    serve.add_argument("--insecure", action="store_true",
                       help="listen beyond loopback without keys: anyone who reaches the port may call")
    serve.add_argument("--weights-dir", action="append", default=[], metavar="DIR",
                       help="a folder update_weights(path=...) may read from (repeatable); without one, a daemon "
                            "on loopback reads any path and one beyond it reads none")
    add_engine_arguments(serve, default_mode="specactor")
    add_pool_arguments(serve)
    serve.add_argument("--client-timeout", type=float, default=10.0,
                       help="seconds without a heartbeat after which a client's requests are aborted")
    serve.add_argument("--drain-timeout", type=float, default=30.0,
                       help="on SIGTERM/SIGINT, seconds running requests may take to finish before being aborted")
    serve.set_defaults(func=_serve)


def _keys(args: argparse.Namespace) -> int:
    from specactor.server.security import create_keys

    try:
        public, secret = create_keys(args.folder, args.name)
    except (ValueError, OSError) as exc:
        print(f"specactor keys: error: {exc}", file=sys.stderr)
        return 2
    print(f"public key {public} (give it to the other side), secret {secret} (keep it; readable by you only)")
    return 0


def _add_keys(commands: argparse._SubParsersAction) -> None:
    keys = commands.add_parser(
        "keys", help="make a CURVE key pair for a daemon or a client",
        description="Write NAME.key (the public key: a daemon's goes to its clients, a client's into the "
        "daemon's --client-keys folder) and NAME.key_secret (the pair: the daemon's --server-key, or a "
        "client's RolloutClient(keys=...)) into FOLDER. Existing keys are never overwritten.",
        formatter_class=HelpFormatter)
    keys.add_argument("folder", metavar="FOLDER")
    keys.add_argument("--name", default="daemon", help="file name of the pair (default %(default)s)")
    keys.set_defaults(func=_keys)


def _bench(args: argparse.Namespace) -> int:
    import time

    from specactor.bench.suite import BenchOptions, run_suite, write_outputs
    from specactor.cli.engine_flags import engine_config_from_args

    fields: dict = {k: v for k, v in {
        "prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens, "epochs": args.epochs,
        "other_epochs": args.other_epochs, "repeats": args.repeats,
        "temperatures": None if args.temperatures is None else tuple(float(t) for t in args.temperatures.split(",")),
        "modes": None if args.modes is None else tuple(m.strip() for m in args.modes.split(",") if m.strip()),
        "out": args.out}.items() if v is not None}
    start = time.perf_counter()

    def progress(line: str) -> None:
        print(f"[{time.perf_counter() - start:6.0f} s] {line}", flush=True)

    try:
        fields["engine"] = engine_config_from_args(args)
        opts = BenchOptions.quick(**fields) if args.quick else BenchOptions(**fields)
        report = run_suite(opts, progress)
    except (ValueError, FileNotFoundError) as exc:
        print(f"specactor bench: error: {exc}", file=sys.stderr)
        return 2
    paths = write_outputs(report, opts.out)
    print((paths[1]).read_text())
    print("wrote " + ", ".join(map(str, paths)))
    return 0


def _add_bench(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser(
        "bench",
        help="the RL long-tail rollout workload: makespan and its phases beside their ceilings, per mode",
        description="Measure the RL long-tail rollout workload: by default 8 HumanEval prompts x 4 samples "
        "(GRPO groups), each as long as the model's EOS makes it up to 768 tokens, at T=1 (the main case: two "
        "epochs with a real GRPO update in between, a step on the first 4 prompts' groups) and T=0 (one epoch: "
        "--other-epochs), modes autoregressive and specactor; on 2 CPU cores a run of the workload takes 1.5-3 "
        "minutes and the GRPO step ~2.5, so the default bench takes 6-20 minutes (--temperatures 1 --epochs 1: "
        "3-7). Every mode runs on the same prompts and seeds. Per mode and epoch "
        "it reports the makespan and its two phases (before and after half of the samples finished: large "
        "batch, then the tail) with their speedups over autoregressive, each beside three ceilings computed "
        "from the same run (an oracle choosing the best method and window per sample and batch size at the "
        "acceptance it saw, a zero-cost drafter, a perfect drafter) and, replayed on autoregressive's tokens with "
        "the real drafters, the policy on an ideal engine and clairvoyant drafts (every token the drafters get "
        "right, no wrong one), and how many samples hit the token cap. "
        "Other modes through --modes: transformers, transformers+pld (prompt lookup cannot batch: only the "
        "first 2 prompts, one sample at a time), coupled ngram, coupled suffix, specactor+learned (the "
        "learned drafter beside ngram and suffix: it trains on each epoch's rollouts once the verifier has no "
        "request left, so it drafts from epoch 2 on; on the CPU its process takes one core from the verifier), vllm (stock "
        "vLLM, on a GPU or its CPU build). vLLM's own speculative methods (its ngram and suffix decoding) beside "
        "specactor on vLLM: python bench/vllm_backend.py. "
        "Writes suite.json, suite.md and suite.png to --out, and runs.jsonl as it goes (one line per finished run; "
        "suite.* also after each temperature but the last, so a bench stopped part-way keeps what it finished).",
        formatter_class=HelpFormatter,
    )
    bench.add_argument("--quick", action="store_true",
                       help="2 prompts x 2 samples, 40 tokens, T=1 and 0 (under 3 minutes)")
    bench.add_argument("--prompts", type=positive_int, default=None, help="HumanEval problems (default 8; quick 2)")
    bench.add_argument("--n", type=positive_int, default=None, help="samples per prompt (default 4; quick 2)")
    bench.add_argument("--max-tokens", type=positive_int, default=None,
                       help="cap per sample; EOS may end a sample earlier (default 768; quick 40)")
    bench.add_argument("--temperatures", default=None, help="comma-separated (default 1,0)")
    bench.add_argument("--epochs", type=positive_int, default=None,
                       help="rollout epochs at the first temperature, the main case (default 2)")
    bench.add_argument("--other-epochs", type=positive_int, default=None,
                       help="rollout epochs at the other temperatures, at most --epochs (default 1)")
    bench.add_argument("--repeats", type=positive_int, default=None,
                       help="run every mode this many times, interleaved, and report the median run and each "
                            "repeat's paired speedup; every second repeat runs the modes in reverse order (default 1; "
                            "use 3 or more to judge differences under ~10%%: a small machine's speed drifts by that "
                            "much within minutes)")
    bench.add_argument("--modes", default=None,
                       help="comma-separated, autoregressive first (default: autoregressive,specactor; also "
                            "transformers, transformers+pld, coupled ngram, coupled suffix, specactor+learned, "
                            "specactor+model (the quantised self-copy on a core of its own), vllm)")
    bench.add_argument("--out", default="bench/results/suite", help="output folder")
    add_engine_arguments(bench, without=("mode", "drafters", "seed", "events", "max_len"))
    bench.set_defaults(func=_bench)


def _add_rollout(commands: argparse._SubParsersAction) -> None:
    rollout = commands.add_parser(
        "rollout",
        help="generate samples for a prompt file (token ids, log-probs, text)",
        description="Generate n samples per prompt with the target model and write one JSON line per "
        "sample: id, sample, prompt_ids, token_ids, logprobs, finish_reason, text, stats. Sample i of the "
        "line with id X gets the seed derived from (the line's seed or --seed, X, i): every mode and entry "
        "point (RolloutEngine, the daemon) gives the same tokens for the same id and seed, whatever else is "
        "in the batch, up to floating-point near-ties (README, 'Lossless'). Each good sample is written to "
        "OUT.partial.jsonl as it finishes; when all are done, OUT gets them in input order. If any sample "
        "fails, nothing replaces OUT: every line goes to OUT.failed.jsonl, failed ones with their error, and "
        "--resume generates only the samples still missing.",
        formatter_class=HelpFormatter,
    )
    rollout.add_argument("--prompts", required=True,
                         help="JSON-lines file ({\"prompt\": ...} or {\"prompt_ids\": [...]}, optional id, n, "
                              "max_tokens, seed, temperature, meta), or humaneval / humaneval:N")
    rollout.add_argument("--out", required=True, help="output JSON-lines file")
    add_engine_arguments(rollout, default_mode="autoregressive", without=("max_len",))
    add_pool_arguments(rollout)
    rollout.add_argument("--temperature", type=_non_negative_float, default=1.0, help="0 = greedy")
    rollout.add_argument("--top-p", type=_probability, default=1.0)
    rollout.add_argument("--top-k", type=int, default=0, help="0 = off")
    rollout.add_argument("--max-tokens", type=positive_int, default=256, help="per sample, unless the line says")
    rollout.add_argument("--n", type=positive_int, default=1, help="samples per prompt, unless the line says")
    rollout.add_argument("--no-chat", action="store_true", help="do not wrap text prompts in the chat template")
    rollout.add_argument("--no-progress", action="store_true", help="no progress bar")
    rollout.add_argument("--resume", action="store_true",
                         help="keep the samples OUT and OUT.partial.jsonl (an interrupted or failed run's) already "
                              "hold for this run's prompts, and generate only the rest (same seeds: the same tokens)")
    rollout.set_defaults(func=_rollout)


def _replay(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from specactor.bench.replay import load_rollout
    from specactor.bench.replay_runs import TABLE_HEADER, ReplaySettings, compare, table_rows
    from specactor.bench.replay_workload import samples_of, told_of
    from specactor.policy.cost_model import CostModel

    if args.temperature is not None and not args.temperature >= 0:  # NaN too
        print(f"specactor replay: --temperature must be at least 0 (got {args.temperature})", file=sys.stderr)
        return 2
    try:
        if args.profile == "cached":
            from specactor.bench.suite import ceiling_cost
            from specactor.config import EngineConfig

            cost = ceiling_cost(EngineConfig(model=args.model))
        else:
            cost = CostModel.from_profile(None if args.profile == "packaged" else args.profile)
        rows = load_rollout(args.rollout)
        limit, greedy = told_of(rows, args.temperature, args.max_tokens)
        settings = ReplaySettings(cost, [m for m in args.drafters.split(",") if m], args.window, seeds=args.seeds,
                                  limit=limit, greedy=greedy)
        samples = samples_of(rows)
        compared = compare(samples, ["geometric", "clairvoyant", "perfect"], settings)
        compared["runs"] = {("specactor policy" if name == "geometric" else name): row
                            for name, row in compared["runs"].items()}
    except (OSError, ValueError) as exc:
        print(f"specactor replay: {exc}", file=sys.stderr)
        return 2
    source = cost.source if cost.source == "packaged" else Path(cost.source).name
    print(f"{len(samples)} samples, {sum(len(o) for _, _, o in samples)} tokens; step times from the {source} "
          f"profile; drafters {', '.join(settings.methods)}, window up to {args.window}; "
          f"max_tokens {settings.limit or 'not known'}, {'greedy' if settings.greedy else 'sampled'}")
    print("\n".join(TABLE_HEADER + table_rows(Path(args.rollout).name, compared)))
    if args.json:
        Path(args.json).write_text(json.dumps(compared, indent=1))
        print(f"wrote {args.json}")
    return 0


def _add_replay(commands: argparse._SubParsersAction) -> None:
    from specactor.speculation import DEFAULT_WINDOW

    replay = commands.add_parser(
        "replay",
        help="what speculation would make of a finished rollout: the policy, clairvoyant drafts and a perfect "
             "drafter replayed on its own tokens",
        description="Replay a finished rollout (JSON lines with id, sample, prompt_ids, token_ids, as "
        "`specactor rollout` writes; any engine's samples of the same model will do) through the real ngram "
        "and suffix drafters. A draft token is accepted iff it equals the token the sample has there, which "
        "is exact under specactor's sampling at any temperature, so every draft's verdict is known without "
        "running the model; step times come from a cost profile. Prints, against plain decoding: the "
        "Fastest-of-N policy as the engine runs it (on an ideal engine: no drafter lookahead, prefill or "
        "messaging), clairvoyant drafts (each step every token the drafters get right and no wrong one: the "
        "most a policy over them could make) and a perfect drafter (every token right), both at their best "
        "of windows 1, 2, 4, 8 and --window and of no drafting (a policy may always decline to draft), "
        "each with its large-batch phase (until half the samples finished) and tail. Takes seconds; "
        "deterministic for a given --seeds. bench/replay_policy.py compares policy settings the same way.",
        formatter_class=HelpFormatter,
    )
    replay.add_argument("rollout", metavar="ROLLOUT.jsonl")
    replay.add_argument("--profile", default="cached",
                        help="step times: 'cached' (this machine's profile of --model, measured at a specactor "
                             "engine's first start; the packaged one if none), 'packaged' (the default model on a "
                             "2-core CPU), or a profile JSON's path")
    replay.add_argument("--model", default=None, help="the model whose cached profile 'cached' means "
                                                      "(default: smollm2-135m)")
    replay.add_argument("--drafters", default="ngram,suffix", help="replayable drafting methods: ngram, suffix")
    replay.add_argument("--window", type=positive_int, default=DEFAULT_WINDOW, help="the most draft tokens a step "
                                                                                   "verifies per request")
    replay.add_argument("--seeds", type=positive_int, default=3,
                        help="policy seeds (its Thompson draws and explorations); the median run is shown")
    replay.add_argument("--max-tokens", type=positive_int, default=None,
                        help="the rollout's max_tokens, which the policy is told (default: the length of its samples "
                             "that stopped there; not known if none did)")
    replay.add_argument("--temperature", type=float, default=None,
                        help="the rollout's temperature; only whether it is 0 matters (default: 0 if every prompt's "
                             "samples are the same tokens, else above 0)")
    replay.add_argument("--json", metavar="OUT.json", help="also write the figures here")
    replay.set_defaults(func=_replay)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specactor",
        description="Lossless speculative rollout for LLM RL post-training "
        "(decoupled draft/verify actors, Fastest-of-N drafter policy).",
    )
    parser.add_argument("--version", action="version", version=f"specactor {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    _add_rollout(commands)
    _add_serve(commands)
    _add_keys(commands)
    _add_bench(commands)
    _add_replay(commands)

    events = commands.add_parser("events", help="inspect structured event logs")
    events_commands = events.add_subparsers(dest="events_command", metavar="ACTION", required=True)
    catalogue = events_commands.add_parser("catalogue", help="print every event name and its fields (markdown)")
    catalogue.set_defaults(func=_events_catalogue)
    summarize = events_commands.add_parser(
        "summarize", help="per method: drafts, acceptance, accepted length, share of tokens; per actor: busy and "
                          "idle time; the tail; the policy's decisions")
    summarize.add_argument("events_file", metavar="EVENTS.jsonl", nargs="+",
                           help="an events file (--events), or one compressed with gzip; several (a pool's, one per "
                                "node) are read together, each replica's actors apart")
    summarize.add_argument("--version", type=int, default=None, metavar="K",
                           help="only the rollout on policy version K (one RL step: from the verifier's switch "
                                "to version K to its next weight update; 0 = before the first)")
    summarize.set_defaults(func=_events_summarize)
    plot = events_commands.add_parser(
        "plot", help="batch size and tokens/s over time, acceptance per method, per-request lanes by drafter")
    plot.add_argument("events_file", metavar="EVENTS.jsonl", help="an events file, plain or gzip-compressed")
    plot.add_argument("--out", required=True, metavar="FIG.png", help="where to write the figure")
    plot.set_defaults(func=_events_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
