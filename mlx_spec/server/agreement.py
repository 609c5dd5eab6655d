"""The scheduler's decisions, made once on rank 0 and followed by every rank of a group.

Under `mlx.launch ... mlx-spec serve` rank 0 takes the requests and runs the scheduler
(worker.py); the other ranks take no requests and run `follow`. Each rank holds its own shard of
the target, so every target pass is a collective: all ranks must start the same rows, step them
in the same order and stop them at the same point. The decisions that come from outside the
model (which request arrived, whether its K/V fit, when its client left) are rank 0's; at every
agreement point (`Together.agree`: each turn's start, between two prompt chunks) rank 0 sends
what it decided since the last one, as data:
- `add`: the requests admitted, in order, each in a message of its own: their prompt tokens,
  media (the arrays the encoder reads: each rank embeds them itself), settings and form of
  answer, which the other ranks turn into the same job (server/generation.py: `from_request`);
- `cancel`: the numbers (in order of admission) of the running requests cancelled;
- `close`: the server is stopping.
While rank 0 waits for requests it sends an empty point every HEARTBEAT seconds
(`heartbeat`), so that a lost rank turns the server down without waiting for the next request;
an idle follower sleeps through most of that time rather than wait for it inside the collective,
where MLX's ring backend spins.
Everything else (what a row keeps, when it ends, the prompt cache's hits and evictions, the
seed of an unseeded request, the cost model's draft lengths) follows from the tokens and the
all-reduced logits, or is itself agreed (decoding/lockstep.py), the same on every rank. A
point with no news costs one small all-reduce.
"""

import threading
import time
from typing import Dict, List, Optional

from mlx_lm.generate import wired_limit

from ..decoding.lockstep import lost_peer
from ..decoding.prompt_cache import PromptCache
from ..errors import MlxSpecError
from ..together import Together
from .admission import KVRoom
from .generation import from_request
from .schemas import APIError

# Seconds between a group's heartbeats while the server waits for requests. Short: an idle
# follower waits for the next one inside a collective, and MLX's ring backend waits by spinning
# (a core busy on every follower, measured: 12.9 CPU-s in 20 s at 5 s). The follower sleeps
# through most of each (agreement.py), and a new request waits for at most one.
HEARTBEAT = 0.05
# How long an idle follower sleeps after a heartbeat: most of HEARTBEAT, so that it is back in
# the collective just before the next one.
IDLE_SLEEP = 0.8 * HEARTBEAT
# The media arrays one request may send to a group's other ranks (base64 in JSON: a third more
# travels), well within what one message carries (2^31 bytes).
MAX_MEDIA_BYTES = 512 * 10**6


class Agreement:
    """Rank 0's side: the news since the last agreement point, sent to the other ranks."""

    def __init__(self, lockstep):
        self.lockstep = lockstep
        self.admitted = 0
        self.added: List[dict] = []

    def refusal(self, job) -> Optional[APIError]:
        """Why a group cannot take this job, if it cannot: its request cannot be sent as data,
        or its media are too large for one message."""
        if self.lockstep.size == 1:
            return None
        if not getattr(job.work, "sendable", False):
            return APIError(400, f"This request cannot be sent to the other ranks of this server's group of "
                            f"{self.lockstep.size}: serve it from one machine.", code="invalid_value")
        if getattr(job.work, "media_bytes", 0) > MAX_MEDIA_BYTES:
            return APIError(413, f"This request's images and audio take {job.work.media_bytes / 1e6:.0f} MB as the "
                            f"encoder reads them; a server split over a group sends at most {MAX_MEDIA_BYTES / 1e6:.0f} "
                            f"MB of them per request to its other ranks. Send fewer or smaller ones.",
                            code="request_too_large")
        return None

    def admit(self, job) -> None:
        job.number, self.admitted = self.admitted, self.admitted + 1
        if self.lockstep.size > 1:
            self.added.append(job.work.request())

    def send(self, cancelled: list) -> None:
        """The news: the jobs admitted since the last point, and the running jobs `cancelled`:
        one message with their count and the cancellations, then one per request (each within
        what one message carries)."""
        if self.lockstep.size == 1:
            return
        news = {"add": len(self.added), "cancel": [job.number for job in cancelled]}
        self.lockstep.message(news if news["add"] or news["cancel"] else None)
        for request in self.added:
            self.lockstep.message(request)
        self.added = []

    def heartbeat(self) -> None:
        """No news, while the server waits for requests: a lost rank is found now, not with the
        next request (an idle follower runs an empty turn)."""
        if self.lockstep.size > 1:
            self.lockstep.message(None)

    def close(self) -> None:
        if self.lockstep.size > 1:
            self.lockstep.message({"close": True})


def group_fault(lockstep):
    """Which errors end every job of a group's server: a lost rank, and any error but a
    request's own (mlx-spec's, or a 4xx: the same on every rank, raised before the ranks part).
    Anything else (memory that ran out on one machine) may have stopped one rank between two
    collectives that the others still run: the ranks can no longer agree."""
    def fatal(error: BaseException) -> bool:
        own = isinstance(error, MlxSpecError) or (isinstance(error, APIError) and error.status < 500)
        return lost_peer(error) or (lockstep.size > 1 and not own)
    return fatal


class Closed(Exception):
    """Rank 0's server stopped: the follower stops too."""


class Follower:
    """A rank other than 0: the jobs rank 0 admits, run step for step beside it. Their events
    go nowhere (rank 0 answers); their errors are the same as rank 0's and end only them."""

    def __init__(self, engine, cache_bytes: int, kv_budget: Optional[int] = None):
        self.engine = engine
        self.cache = PromptCache(engine.target, cache_bytes)
        KVRoom.for_engine(engine, cache_bytes, kv_budget)  # this rank's memory joins the group's (its least)
        self.stopped: Dict[int, threading.Event] = {}  # the running jobs' cancellation, by number
        self.admitted = 0
        self.together = Together(engine, self._agree, fatal=group_fault(engine.lockstep))

    def run(self) -> None:
        """Until rank 0's server stops (or a lost rank raises: cli/group.py says which)."""
        try:
            with wired_limit(self.engine.target.model):
                while True:
                    self.together.turn()
        except Closed:
            pass
        finally:
            self.together.close()

    def _agree(self) -> None:
        news = self.engine.lockstep.message() or {}
        if news.get("close"):
            raise Closed
        if not news and not self.together.tasks:  # rank 0 waits for requests: its next point is a heartbeat away
            time.sleep(IDLE_SLEEP)
            return
        live = {task.info["number"] for task in self.together.tasks}
        self.stopped = {n: e for n, e in self.stopped.items() if n in live}
        for _ in range(news.get("add", 0)):
            work, stopped = from_request(self.engine.lockstep.message()), threading.Event()
            self.stopped[self.admitted] = stopped
            task = self.together.add(
                lambda stop, work=work: work(self.engine, self.cache, stop, self.together.batch),
                lambda event: None, stopped.is_set)
            task.info["number"], self.admitted = self.admitted, self.admitted + 1
        for number in news.get("cancel", []):  # (a job that ended this turn is no longer here)
            if number in self.stopped:
                self.stopped[number].set()


def follow(engine, cache_bytes: int, kv_budget: Optional[int] = None) -> None:
    """Serve as a rank other than 0 of a group (see the module docstring)."""
    Follower(engine, cache_bytes, kv_budget).run()
