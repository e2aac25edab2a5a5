"""Reading a text file that may be gzip-compressed: run records (event logs, rollouts) are kept
compressed once a run is over (a T=1 rollout's events are about a megabyte, a tenth of that
compressed), and every reader takes either, told by the file's first bytes rather than its name."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b"


def read_text(path: str | Path) -> str:
    """The whole text of ``path``, decompressed if it is gzip; ValueError naming the file where a
    compressed one is cut off or damaged, or the text is not UTF-8 (OSError where it cannot be read)."""
    data = Path(path).read_bytes()
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise ValueError(f"{path}: compressed file damaged ({exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
