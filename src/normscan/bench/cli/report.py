"""Plain-text tables, an optional progress bar (tqdm, when installed) and argument types
for the commands."""

from __future__ import annotations

import argparse
import sys
from typing import Iterable, Sequence, TypeVar

T = TypeVar("T")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print(format_table(headers, rows))


def progress(items: Iterable[T], what: str) -> Iterable[T]:
    """Items with a progress bar on stderr when tqdm is there and stderr is a terminal."""
    items = list(items)
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional: count on stderr instead
        for i, item in enumerate(items):
            print(f"{what}: {i + 1}/{len(items)}", file=sys.stderr, flush=True)
            yield item
        return
    yield from tqdm(items, desc=what, file=sys.stderr, disable=None)


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (argparse names the argument)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {value}")
    return value
