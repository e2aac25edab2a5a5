"""The ``specactor`` command line."""

from __future__ import annotations

import argparse
import sys

from specactor import __version__


def _events_catalogue(args: argparse.Namespace) -> int:
    from specactor.events import catalogue_markdown

    sys.stdout.write(catalogue_markdown())
    return 0


def _events_summarize(args: argparse.Namespace) -> int:
    from specactor.event_log import format_summary, read_events, summarize

    try:
        print(format_summary(summarize(read_events(args.events_file))))
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
    from specactor.prompts import PromptFileError
    from specactor.rollout import RolloutOptions, run_rollout

    opts = RolloutOptions(
        prompts=args.prompts, out=args.out, model=args.model, mode=args.mode, drafters=args.drafters,
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens,
        n=args.n, seed=args.seed, events=args.events, max_batch=args.max_batch, threads=args.threads,
        chat=not args.no_chat, progress=False if args.no_progress else None, k=args.k, window=args.window,
        policy=not args.no_policy, racing=not args.no_racing,
    )
    try:
        run_rollout(opts)
    except (PromptFileError, ValueError, FileNotFoundError, NotImplementedError) as exc:
        print(f"specactor rollout: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


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


def _add_rollout(commands: argparse._SubParsersAction) -> None:
    rollout = commands.add_parser(
        "rollout",
        help="generate samples for a prompt file (token ids, log-probs, text)",
        description="Generate n samples per prompt with the target model and write one JSON line per "
        "sample: id, sample, prompt_ids, token_ids, logprobs, finish_reason, text, stats. Seeds are "
        "derived from (--seed, id, sample), so every mode gives the same tokens for the same input.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    rollout.add_argument("--prompts", required=True,
                         help="JSON-lines file ({\"prompt\": ...} or {\"prompt_ids\": [...]}, optional id, n, "
                              "max_tokens, seed, temperature, meta), or humaneval / humaneval:N")
    rollout.add_argument("--out", required=True, help="output JSON-lines file")
    rollout.add_argument("--model", default=None,
                         help="registry name (default smollm2-135m) or a local Hugging Face checkpoint folder")
    rollout.add_argument("--mode", default="autoregressive", choices=["autoregressive", "coupled", "specactor"],
                         help="autoregressive baseline, coupled speculation, or SpecActor "
                              "(decoupled, steered by the Fastest-of-N policy)")
    rollout.add_argument("--drafters", default="ngram,suffix",
                         help="drafting methods for the speculative modes (coupled uses the first); add 'model' "
                              "where the model drafter gets cores of its own (GPU, or more than 2 CPU cores)")
    rollout.add_argument("--k", type=_positive_int, default=4, help="tokens per draft proposal")
    rollout.add_argument("--window", type=_positive_int, default=8,
                         help="decoupled: how far a drafter may draft ahead of the last verdict")
    rollout.add_argument("--temperature", type=_non_negative_float, default=1.0, help="0 = greedy")
    rollout.add_argument("--top-p", type=_probability, default=1.0)
    rollout.add_argument("--top-k", type=int, default=0, help="0 = off")
    rollout.add_argument("--max-tokens", type=_positive_int, default=256, help="per sample, unless the line says")
    rollout.add_argument("--n", type=_positive_int, default=1, help="samples per prompt, unless the line says")
    rollout.add_argument("--seed", type=int, default=0, help="base seed")
    rollout.add_argument("--events", default=None, help="write structured events (JSON lines) here")
    rollout.add_argument("--max-batch", type=_positive_int, default=32, help="requests decoded together")
    rollout.add_argument("--threads", type=_positive_int, default=None, help="torch threads (default: all cores)")
    rollout.add_argument("--no-policy", action="store_true",
                         help="specactor mode without the Fastest-of-N policy: every drafter on every request")
    rollout.add_argument("--no-racing", action="store_true",
                         help="the policy never races a second method on tail requests")
    rollout.add_argument("--no-chat", action="store_true", help="do not wrap text prompts in the chat template")
    rollout.add_argument("--no-progress", action="store_true", help="no progress bar")
    rollout.set_defaults(func=_rollout)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specactor",
        description="Lossless speculative rollout for LLM RL post-training "
        "(decoupled draft/verify actors, Fastest-of-N drafter policy).",
    )
    parser.add_argument("--version", action="version", version=f"specactor {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    _add_rollout(commands)

    events = commands.add_parser("events", help="inspect structured event logs")
    events_commands = events.add_subparsers(dest="events_command", metavar="ACTION", required=True)
    catalogue = events_commands.add_parser("catalogue", help="print every event name and its fields (markdown)")
    catalogue.set_defaults(func=_events_catalogue)
    summarize = events_commands.add_parser(
        "summarize", help="per method: drafts, acceptance, accepted length, share of tokens; per actor: busy and "
                          "idle time; the tail; the policy's decisions")
    summarize.add_argument("events_file", metavar="EVENTS.jsonl")
    summarize.set_defaults(func=_events_summarize)
    plot = events_commands.add_parser(
        "plot", help="batch size and tokens/s over time, acceptance per method, per-request lanes by drafter")
    plot.add_argument("events_file", metavar="EVENTS.jsonl")
    plot.add_argument("--out", required=True, metavar="FIG.png", help="where to write the figure")
    plot.set_defaults(func=_events_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
