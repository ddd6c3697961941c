"""Progress of the experiments: the one home of their bars, status lines and ``--quiet`` switch.

Every experiment reports how far it is (a tqdm bar, or a status line every few seconds on long single steps:
which split, which model, how far) on stderr, so that the tables on stdout stay clean. ``python -m experiments
NAME --quiet`` turns all of it off, the library's own bars included: ``__main__`` sets ``TQDM_DISABLE=1`` before
anything imports tqdm, and `set_quiet` silences the status lines.
"""

from __future__ import annotations

import os
import sys
import time

__all__ = ["set_quiet", "is_quiet", "bar", "note"]

_START = time.perf_counter()


def set_quiet(quiet: bool) -> None:
    """Silence (``True``) or restore the status lines and bars of this process and of the processes it starts."""
    os.environ["SMNNGP_QUIET"] = "1" if quiet else ""
    os.environ["TQDM_DISABLE"] = "1" if quiet else ""


def is_quiet() -> bool:
    """Whether progress output is switched off (``--quiet``, or ``SMNNGP_QUIET=1`` in the environment)."""
    return os.environ.get("SMNNGP_QUIET", "") not in ("", "0")


def bar(iterable=None, **kwargs):
    """A tqdm bar over ``iterable`` (keyword arguments as tqdm's) that stays silent under ``--quiet``."""
    from tqdm.auto import tqdm

    kwargs["disable"] = kwargs.get("disable", False) or is_quiet()
    return tqdm(iterable, **kwargs)


def note(message: str) -> None:
    """Print ``[elapsed] message`` on stderr (flushed) unless quiet: one line per long step."""
    if not is_quiet():
        print(f"[{time.perf_counter() - _START:7.1f} s] {message}", file=sys.stderr, flush=True)
