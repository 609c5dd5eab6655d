"""The decisions every rank of a group must make alike, made once: rank 0's.

Under tensor parallelism (models/gemma4/tensor_parallel.py) every rank runs the same cycles,
and each pass holds collectives: a rank that drafted 3 guesses where another drafted 4 would
wait on the other's all-reduces forever, or sum garbage. Whatever a rank would draw from its
own clock or its own entropy is taken from rank 0 instead:
- a step's measured time, which the cost model turns into draft lengths (draft_lengths.py);
- the seed of a request that gave none;
- what only rank 0 reads or is told: a chat's lines, a user's Ctrl-C, a server's requests and
  its scheduler's decisions (`message`: which requests join the batch, which were cancelled);
- the memory the scheduler admits rows by (`least`: the smallest rank's, so that a row that
  fits on rank 0 fits on every rank).
Everything else the loop decides (acceptance, what a cycle keeps, which rows step) follows
from the tokens and the logits, which the all-reduces make the same on every rank.
"""

import errno
import hashlib
import json
import os
import subprocess
import sys
import time
from typing import Any, Optional

import mlx.core as mx
import numpy as np

from ..errors import GroupError


class Lockstep:
    """The group's agreement; a group of one agrees with itself at no cost."""

    def __init__(self, group: Optional[mx.distributed.Group] = None):
        self.group = group

    @property
    def size(self) -> int:
        return self.group.size() if self.group is not None else 1

    @property
    def rank(self) -> int:
        return self.group.rank() if self.group is not None else 0

    @property
    def leader(self) -> bool:
        """Whether this rank prints, streams and serves (rank 0)."""
        return self.rank == 0

    def _from_leader(self, values: list, dtype=mx.float32) -> list:
        if self.size == 1:
            return values
        mine = mx.array(values if self.leader else [0] * len(values), dtype=dtype)
        return mx.distributed.all_sum(mine, group=self.group, stream=mx.cpu).tolist()

    def seconds(self, seconds: Optional[float]) -> Optional[float]:
        """Rank 0's measured time of a step (None: it timed none, and neither did the others:
        whether a step is timed follows from its shape and traces, the same on every rank)."""
        if self.size == 1 or seconds is None:
            return seconds
        return self._from_leader([seconds])[0]

    def seed(self) -> int:
        """A fresh seed, rank 0's (a request without one samples alike on every rank)."""
        seed = int.from_bytes(os.urandom(3), "little")  # exact in a float32
        return int(self._from_leader([float(seed)])[0])

    def line(self, line: Optional[str]) -> Optional[str]:
        """Rank 0's line of input (None: its input ended), for every rank (a chat's next line,
        a prompt: only rank 0 reads them)."""
        data = self.data(line.encode() if self.leader and line is not None else None)
        return None if data is None else data.decode()

    def data(self, data: Optional[bytes]) -> Optional[bytes]:
        """Rank 0's bytes (None: none), for every rank: a line, a request, a file only rank 0
        can read."""
        if self.size == 1:
            return data
        length = self._from_leader([-1 if self.leader and data is None else len(data or b"")], mx.int32)[0]
        if length <= 0:
            return None if length < 0 else b""
        mine = np.frombuffer(data, dtype=np.uint8) if self.leader else np.zeros(length, dtype=np.uint8)
        summed = mx.distributed.all_sum(mx.array(mine), group=self.group, stream=mx.cpu)
        return np.asarray(summed).tobytes()

    def flag(self, value: bool) -> bool:
        """Rank 0's yes or no (a user's Ctrl-C: the answer stops at the same token everywhere)."""
        if self.size == 1:
            return value
        return self._from_leader([1.0 if value else 0.0])[0] > 0

    def message(self, value: Any = None) -> Any:
        """Rank 0's JSON value, for every rank (None, or anything empty: no news, at the cost of
        one small all-reduce)."""
        if self.size == 1:
            return value
        line = self.line(json.dumps(value) if self.leader and value else "")
        return json.loads(line) if line else None

    def least(self, value: float) -> float:
        """The smallest of every rank's value (each rank's memory budget)."""
        if self.size == 1:
            return value
        return mx.distributed.all_min(mx.array([value], dtype=mx.float32), group=self.group, stream=mx.cpu).item()

    def agree(self, what: str, value: str) -> None:
        """A GroupError on every rank unless every rank's `value` is rank 0's: `what` (a run's
        settings and prompt) given otherwise to one rank would make it run other cycles, and the
        ranks would wait on each other's collectives for ever."""
        if self.size == 1:
            return
        digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()
        mine = [float(int.from_bytes(digest[i : i + 3], "little")) for i in (0, 3, 6)]  # (exact in a float32)
        same = self._from_leader(mine) == mine
        if self.least(1.0 if same else 0.0) < 1:
            which = "rank 0's" if same else f"those of rank {self.rank}"
            raise GroupError(f"the ranks of the group were not started alike: {what} differ from {which} (give every "
                             "rank the same command)")

    def describe(self) -> dict:
        """The group as `--json` and /health report it."""
        return {"size": self.size, "rank": self.rank}


# How MLX's backends begin the errors of a lost peer ("[ring] connection to a peer was lost").
BACKENDS = ("[ring]", "[jaccl]", "[mpi]", "[nccl]")


def lost_peer(error: BaseException) -> bool:
    """Whether a collective failed because a rank of the group died or its link broke: the run
    cannot go on (no later collective can complete), as opposed to an error of one request."""
    return isinstance(error, RuntimeError) and str(error).startswith(BACKENDS)


def launched_group(timeout: Optional[float] = None):
    """The group of processes `mlx.launch` started this one in, with any backend it offers
    (ring, jaccl, mpi); None where this process runs alone. A rank that cannot reach the others
    within `timeout` seconds (MLX_SPEC_GROUP_TIMEOUT, 60 by default) ends with a message that
    says so: MLX's own wait has no end (and holds the interpreter, so the watch is a process).
    A rank whose neighbour is not listening yet tries again: the ring backend gives up connecting
    after about 31 s of its own, and a rank started that much later (a loaded machine, a slow
    disk) is no fault of the group's."""
    if not any(name in os.environ for name in LAUNCHED):
        return None
    if timeout is None:
        timeout = float(os.environ.get("MLX_SPEC_GROUP_TIMEOUT", 60))
    message = (f"mlx-spec: rank {os.environ.get('MLX_RANK', '?')} could not reach the other ranks of its group "
               f"within {timeout:g} s (are they all started, and is each host reachable?)")
    watch = subprocess.Popen([sys.executable, "-c", WATCH, str(os.getpid()), str(timeout), message])
    try:
        group = join()
    except RuntimeError as e:  # a host file that does not parse, a port taken, a rank past the group
        raise GroupError(f"rank {os.environ.get('MLX_RANK', '?')} could not join its group: {e}") from None
    finally:
        watch.kill()
        watch.wait()
    return group if group.size() > 1 else None


def join():
    """mx.distributed.init(), again for as long as the neighbour refuses the connection or does
    not answer it (the watch of `launched_group` bounds the time); any other failure is raised
    as it is. A second between tries: the ring backend waits about 31 s in each, but a backend
    that failed at once would otherwise spin on a core its neighbour may need to start."""
    while True:
        try:
            return mx.distributed.init()
        except RuntimeError as e:
            if not any(f"(error: {code})" in str(e) for code in (errno.ECONNREFUSED, errno.ETIMEDOUT)):
                raise
        time.sleep(RETRY_PAUSE)


RETRY_PAUSE = 1.0  # seconds between two tries at joining the group
# Set by mlx.launch in every process it starts (ring and jaccl; MPI's own for mpi).
LAUNCHED = ("MLX_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
# The watch: the rank's process is ended, with the message, if it is still there after the time.
# It ends with the rank (a rank ended otherwise, as mlx.launch ends one by SIGTERM, runs no
# `finally`): it is the rank's child for as long as the rank lives, and never signals another
# process that took the rank's id.
WATCH = """import os, sys, time
pid, timeout, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
deadline = time.monotonic() + timeout
while time.monotonic() < deadline:
    if os.getppid() != pid:
        sys.exit(0)
    time.sleep(0.2)
if os.getppid() == pid:
    print(message, file=sys.stderr, flush=True)
    os.kill(pid, 9)
"""
