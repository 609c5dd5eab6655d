"""A command run by `mlx.launch` on each rank of a group (joined by decoding/lockstep.py's
`launched_group`): rank 0 alone printing, and a rank that is lost ending the others with a
message (docs/distributed.md)."""

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from ..decoding.lockstep import launched_group, lost_peer
from ..errors import GroupError


def join_launched_group():
    """This process's group (`launched_group`; None alone). A rank of a group ends, as a SIGTERM
    would end it, once the process that started it has ended: mlx.launch forwards no SIGTERM,
    so `kill` of the launcher (a supervisor, `timeout`) left every rank running, a server still
    answering on its port (found by a review)."""
    group = launched_group()
    if group is not None:
        parent = os.getppid()
        threading.Thread(target=_end_with, args=(parent,), daemon=True, name="mlx-spec-launcher-watch").start()
    return group


def _end_with(parent: int) -> None:
    while os.getppid() == parent:  # (an orphan is adopted: its parent's id changes)
        time.sleep(LAUNCHER_POLL)
    os.kill(os.getpid(), signal.SIGTERM)


LAUNCHER_POLL = 0.5  # seconds between two looks at whether the launcher is still there


@contextmanager
def group_faults(engine):
    """Under a group, a collective that fails (a rank died or its link broke: MLX raises a
    RuntimeError) ends the run with a GroupError naming it."""
    try:
        yield
    except RuntimeError as e:
        if engine.lockstep.size == 1 or not lost_peer(e):
            raise
        raise GroupError(f"the group of {engine.lockstep.size} lost a rank ({e}); this rank "
                         f"({engine.lockstep.rank}) stops too") from None


def follow_quietly(engine) -> bool:
    """On a rank other than 0 of a group, this process's standard output goes nowhere (rank 0
    prints; the others compute beside it), and Ctrl-C is rank 0's alone (a terminal's reaches
    every local rank: rank 0 stops the answer and sends the stop on). Whether this rank prints."""
    if engine.lockstep.leader:
        return True
    sys.stdout = open(os.devnull, "w")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return False


def shared_file(lockstep, path: str) -> Optional[bytes]:
    """A file only rank 0 reads (an --image, an --audio clip, chat's /image): its bytes, on every
    rank of the group (the others may not have it); None where rank 0 cannot read it (or it is
    over a gigabyte)."""
    data = None
    if lockstep.leader:
        try:
            if Path(path).expanduser().stat().st_size <= MAX_SHARED_BYTES:  # what one message carries
                data = Path(path).expanduser().read_bytes()
        except OSError:
            pass
    return lockstep.data(data)


MAX_SHARED_BYTES = 2**30
# Why `shared_file` gave None, in words every rank can give (only rank 0 knows which it was).
UNSHARED = f"rank 0 of the group cannot read this file, or it is over {MAX_SHARED_BYTES >> 30} GiB (the most a group shares)"
