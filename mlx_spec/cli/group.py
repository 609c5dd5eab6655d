"""A command run by `mlx.launch` on each rank of a group: joining the group, rank 0 alone
printing, and a rank that is lost ending the others with a message (docs/distributed.md)."""

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from ..decoding.lockstep import lost_peer
from ..errors import GroupError


def launched_group(timeout: Optional[float] = None):
    """The group of processes `mlx.launch` started this one in, with any backend it offers
    (ring, jaccl, mpi); None where this process runs alone. A rank that cannot reach the others
    within `timeout` seconds (MLX_SPEC_GROUP_TIMEOUT, 60 by default) ends with a message that
    says so: MLX's own wait has no end (and holds the interpreter, so the watch is a process)."""
    import mlx.core as mx

    if not any(name in os.environ for name in LAUNCHED):
        return None
    if timeout is None:
        timeout = float(os.environ.get("MLX_SPEC_GROUP_TIMEOUT", 60))
    message = (f"mlx-spec: rank {os.environ.get('MLX_RANK', '?')} could not reach the other ranks of its group "
               f"within {timeout:g} s (are they all started, and is each host reachable?)")
    watch = subprocess.Popen([sys.executable, "-c", WATCH, str(os.getpid()), str(timeout), message])
    try:
        group = mx.distributed.init()
    finally:
        watch.kill()
        watch.wait()
    return group if group.size() > 1 else None


# Set by mlx.launch in every process it starts (ring and jaccl; MPI's own for mpi).
LAUNCHED = ("MLX_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
# The watch: the rank's process is ended, with the message, if it is still there after the time.
WATCH = """import os, sys, time
pid, timeout, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
time.sleep(timeout)
print(message, file=sys.stderr, flush=True)
os.kill(pid, 9)
"""


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
