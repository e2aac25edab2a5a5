"""The ``specactor`` command line."""

from __future__ import annotations

import argparse
import sys

from specactor import __version__


def _events_catalogue(args: argparse.Namespace) -> int:
    from specactor.events import catalogue_markdown

    sys.stdout.write(catalogue_markdown())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specactor",
        description="Lossless speculative rollout for LLM RL post-training "
        "(decoupled draft/verify actors, Fastest-of-N drafter policy).",
    )
    parser.add_argument("--version", action="version", version=f"specactor {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    events = commands.add_parser("events", help="inspect structured event logs")
    events_commands = events.add_subparsers(dest="events_command", metavar="ACTION", required=True)
    catalogue = events_commands.add_parser("catalogue", help="print every event name and its fields (markdown)")
    catalogue.set_defaults(func=_events_catalogue)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
