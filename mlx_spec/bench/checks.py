"""The benchmarks' flags, checked as argparse reads them (`type=`): a bad value is a one-line
error naming the flag before anything runs (a table takes minutes to hours on a Mac), never a
traceback from deep inside a table or a figure made of nonsense (an acceptance of 1.5)."""

import argparse
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Tuple


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def at_least(low: int, high: Optional[int] = None) -> Callable[[str], int]:
    """A whole number from `low` (up to `high`)."""

    def check(text: str) -> int:
        value = _int(text)
        if value < low or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {span}, got {value}")
        return value

    return check


def whole_numbers(low: int, high: Optional[int] = None) -> Callable[[str], List[int]]:
    """Comma-separated whole numbers, each from `low` (up to `high`)."""
    one = at_least(low, high)

    def check(text: str) -> List[int]:
        return [one(part) for part in _parts(text)]

    return check


def acceptances(text: str) -> List[float]:
    """Comma-separated acceptances: each the chance that a guess is kept, from 0 to 1."""
    out = []
    for part in _parts(text):
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a number") from None
        if not 0 <= value <= 1:
            raise argparse.ArgumentTypeError(f"an acceptance is a chance, from 0 to 1, got {part}")
        out.append(value)
    return out


def length_range(text: str) -> Tuple[int, int]:
    """'low,high': lengths drawn from low up to (not including) high, 1 <= low < high."""
    parts = _parts(text)
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"give a range as LOW,HIGH, got {text!r}")
    low, high = (at_least(1)(p) for p in parts)
    if low >= high:
        raise argparse.ArgumentTypeError(f"LOW must be below HIGH, got {text!r}")
    return low, high


def known_names(known: Iterable[str]) -> Callable[[str], str]:
    """Comma-separated names, each one of `known`; the text itself comes back."""
    known = list(known)

    def check(text: str) -> str:
        unknown = [n for n in _parts(text) if n not in known]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
        return text

    return check


def existing_file(text: str) -> str:
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no file at {text}")
    return text


def not_a_file(text: str) -> str:
    """A folder for the results: one that exists, or none yet; not a file."""
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file; give a folder for the results")
    return text


def _parts(text: str) -> List[str]:
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise argparse.ArgumentTypeError(f"give comma-separated values, got {text!r}")
    return parts
