"""The scheduler in front of the one model.

One thread owns the model: it loads it (MLX arrays belong to the stream of the thread that made
them) and runs every MLX computation, so the event loop stays free to read and answer other
connections. A request is a `Job`: a function the thread calls with the engine, the prompt
cache, a `stop` callback to pass its prompt (asked between chunks) and the batch it decodes in,
returning a generator of events. The events reach the event loop through an asyncio queue.

Up to `max_batch` jobs run at once, decoding together (mlx_spec/together.py: one target pass
verifies every row's guesses; a new prompt goes in by chunks between the others' steps); the
rest wait in order. A job is admitted only while the K/V of every running row and its own fit
in memory (`KVRoom`); a job that could never fit alone is refused with a 400. Cancelling a job
(its client left) ends its row at the next chunk or step: the sequence goes back to the prompt
cache consistent, and the next job in the queue takes its place.

Under a group (`mlx.launch ... mlx-spec serve`), this scheduler runs on rank 0 and the other
ranks follow it (agreement.py): at the start of each turn and between two prompt chunks, the
jobs admitted since and the ones cancelled reach every rank as data, so that every rank runs the
same rows through the same steps. A job's cancellation counts from that point (`Job.agreed`),
on rank 0 as on the others. A rank that is lost ends every job with a 503 and leaves the server
down (`status()["down"]`): no step can complete without it.
"""

import asyncio
import logging
import queue
import threading
from collections import deque
from typing import Any, Callable, Iterator, Optional

from mlx_lm.generate import wired_limit

from ..decoding.lockstep import lost_peer
from ..decoding.prompt_cache import PromptCache
from ..errors import LoadError
from ..together import Together
from .admission import KVRoom, no_room, too_big
from .agreement import HEARTBEAT, Agreement, group_fault
from .generation import Done
from .job import END, Job
from .schemas import APIError

LOG = logging.getLogger("mlx_spec.server")
DEFAULT_MAX_BATCH = 8


class Worker:
    """One thread running up to `max_batch` jobs together over one engine and one prompt cache."""

    def __init__(self, load: Callable[[], Any], cache_bytes: int, max_batch: int = DEFAULT_MAX_BATCH,
                 kv_budget: Optional[int] = None):
        """load: makes the Engine, on the model's thread; its errors are raised here.
        kv_budget: bytes the rows' K/V may take (None: what memory leaves, see admission.py)."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.max_batch = max_batch
        self.engine, self.cache, self.room, self._load_error = None, None, None, None
        self.agreement: Optional[Agreement] = None
        self.down: Optional[str] = None  # why the server cannot answer any more (its group lost a rank)
        # Called once when rank 0 failed alone under a group: the other ranks may wait in a
        # collective it will never join, and only its process ending ends them (serve() stops).
        self.on_broken_group: Callable[[], None] = lambda: None
        self.broken_group = False
        self.jobs: "queue.Queue[Optional[Job]]" = queue.Queue()
        self.waiting: deque = deque()  # jobs taken off the queue, not admitted yet (no room)
        self.running: list = []
        self.served = 0
        self.refused = 0  # jobs whose K/V could never fit (a 400 from the queue)
        # Tokens served under a constraint (a schema, a grammar, a forced call), and the host's
        # time building their masks (constraints/matcher.py)
        self.constrained = {"tokens": 0, "mask_ms": 0.0}
        self.dropped = 0  # jobs whose client left
        self.snapshot = {"rows": 0, "tokens_per_second": 0.0, "steps": 0}
        self.cache_info = {"sequences": 0, "bytes": 0}
        self._closing = False
        self._lock = threading.RLock()  # re-entrant: a signal handler may cancel jobs
        loaded = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(load, cache_bytes, kv_budget, loaded),
                                       name="mlx-spec-model", daemon=True)
        self.thread.start()
        loaded.wait()
        if self._load_error is not None:
            raise self._load_error

    def submit(self, work: Callable[..., Iterator[Any]]) -> Job:
        # A request's answer is cut to what the context leaves: it never reaches past it.
        positions = min(getattr(work, "positions", 0), self.engine.context_length)
        job = Job(work, asyncio.get_running_loop(), positions)
        refusal = self._down_error() if self.down is not None else self.agreement.refusal(job)
        if refusal is not None:
            job.emit(refusal)
            job.emit(END)
            return job
        self.jobs.put(job)
        return job

    def status(self) -> dict:
        with self._lock:
            down = {"down": self.down} if self.down is not None else {}
            running = sum(not job.answered for job in self.running)
            return {**down, "running": running, "waiting": len(self.waiting) + self.jobs.qsize(),
                    "max_batch": self.max_batch, "batch": dict(self.snapshot), "served": self.served,
                    "refused": self.refused, "dropped": self.dropped, "prompt_cache": dict(self.cache_info),
                    "constrained": dict(self.constrained)}

    def cancel_all(self) -> None:
        """Cancel the running jobs (at their next chunk or step) and every waiting one."""
        with self._lock:
            jobs = [*self.running, *self.waiting, *list(self.jobs.queue)]
        for job in jobs:
            if job is not None:
                job.cancel()

    def end_all(self) -> None:
        """The server is stopping: every job is cancelled, and its answer ends now with a 503
        rather than at its row's next step (which a group that lost a rank never reaches)."""
        self.cancel_all()
        with self._lock:
            jobs = [*self.running, *self.waiting, *list(self.jobs.queue)]
        for job in jobs:
            if job is not None:
                job.emit(APIError(503, "The server is shutting down.", type="server_error"))
                job.emit(END)

    def close(self, timeout: float = 10.0) -> None:
        """Cancel every job and stop the thread."""
        self.cancel_all()
        self._closing = True
        self.jobs.put(None)
        self.thread.join(timeout)

    def _run(self, load, cache_bytes: int, kv_budget: Optional[int], loaded: threading.Event) -> None:
        try:
            self.engine = load()
            self.cache = PromptCache(self.engine.target, cache_bytes)
            self.room = KVRoom.for_engine(self.engine, cache_bytes, kv_budget)
            if kv_budget is None and not self.room.fits_alone(1):  # (every request would be a 400)
                raise LoadError(no_room(self.room.budget, cache_bytes))
            self.agreement = Agreement(self.engine.lockstep)
            together = Together(self.engine, self._agree, fatal=group_fault(self.engine.lockstep))
        except BaseException as e:
            self._load_error = e
            return
        finally:
            loaded.set()
        try:
            self._schedule(together)
            self.agreement.close()
        except Exception as e:  # a lost rank, or (under a group) an error one rank may have alone
            self._lose_group(e)
        together.close()
        for job in [*self.running, *self.waiting]:  # the server is stopping: their streams end now
            self._finish(job)
        while self.down is not None:  # what was queued meanwhile is refused, until the server stops
            job = self.jobs.get()
            if job is None:
                return
            job.emit(self._down_error())
            self._finish(job)

    def _schedule(self, together: Together) -> None:
        while not self._closing:
            if not together.busy and not self._take(block=True):
                return
            self._take(block=False)
            self._admit(together)
            if together.busy:
                with wired_limit(self.engine.target.model):  # (see Decoder.generate)
                    while together.busy and not self._closing:
                        together.turn()
                        self._after_turn(together)
                        self._take(block=False)
                        self._admit(together)

    def _agree(self) -> None:
        """What every rank follows from here (Together calls it at each turn and between two
        chunks): the jobs admitted since the last time, and the running ones cancelled."""
        with self._lock:
            left = [j for j in self.running if j.cancelled.is_set() and not j.agreed.is_set()]
        self.agreement.send(left)
        for job in left:
            job.agreed.set()

    def _lose_group(self, error: Exception) -> None:
        """The group lost a rank, or the model's thread failed: every job ends with a 503, and
        so does every later request."""
        size = self.engine.lockstep.size
        if lost_peer(error):
            self.down = f"the group of {size} lost a rank ({error}); the server cannot answer until it is started again"
        else:
            self.down = (f"the model's thread failed ({type(error).__name__}: {error})"
                         + (f"; the group of {size} can no longer agree" if size > 1 else ""))
        LOG.error("mlx-spec: %s", self.down, exc_info=None if lost_peer(error) else error)
        with self._lock:
            self.snapshot = dict(self.snapshot, rows=0, tokens_per_second=0.0)
        for job in [*self.running, *self.waiting]:
            job.emit(self._down_error())
        if size > 1 and not lost_peer(error):
            self.broken_group = True
            self.on_broken_group()

    def _down_error(self) -> APIError:
        return APIError(503, f"The server is down: {self.down}.", type="server_error")

    def _take(self, block: bool) -> bool:
        """Move submitted jobs into the waiting line; False when the worker is to stop. Under a
        group, waiting for a job sends a heartbeat every HEARTBEAT seconds."""
        while True:
            waits = block and not self.waiting
            try:
                job = self.jobs.get(block=waits, timeout=HEARTBEAT if waits and self.engine.lockstep.size > 1 else None)
            except queue.Empty:
                if not waits:
                    return True
                self.agreement.heartbeat()
                continue
            if job is None:
                return False
            with self._lock:
                self.waiting.append(job)
            block = False

    def _admit(self, together: Together) -> None:
        """Start waiting jobs, in order, while there is a row for them and their K/V fit."""
        for job in [j for j in self.waiting if j.cancelled.is_set()]:  # their clients left while they waited
            with self._lock:
                self.waiting.remove(job)
            self._finish(job)
        while self.waiting:
            job = self.waiting[0]
            cap = getattr(job.work, "cap", None)
            if not self.room.fits_alone(job.positions) and cap and cap(self.room.most_alone(job.positions)):
                job.positions = job.work.positions  # a ceiling's answer, cut where memory ends (generation.py)
            if not self.room.fits_alone(job.positions):
                with self._lock:
                    self.waiting.popleft()
                job.emit(APIError(400, too_big(self.room, job.positions), code="context_length_exceeded"))
                self._finish(job, refused=True)
                continue
            if len(self.running) >= self.max_batch or not self.room.fits([j.positions for j in self.running] + [job.positions]):
                return
            with self._lock:
                self.running.append(self.waiting.popleft())
            self.agreement.admit(job)
            together.add(lambda stop, job=job: job.work(self.engine, self.cache, stop, together.batch),
                         lambda event, job=job: self._emit(job, event), job.agreed.is_set).info["job"] = job

    def _after_turn(self, together: Together) -> None:
        """Finish the jobs whose tasks ended, and note the batch's figures for /health."""
        alive = {id(t.info["job"]) for t in together.tasks}
        for job in [j for j in self.running if id(j) not in alive]:
            self._finish(job)
        rows = len(together.batch.rows)
        # An idle batch decodes nothing: its rate over the last seconds would stay on /health
        # until the next request, as the worker waits for one without another turn.
        rate = round(together.batch.tokens_per_second, 1) if rows else 0.0
        with self._lock:
            self.snapshot = {"rows": rows, "tokens_per_second": rate, "steps": together.batch.steps}
            self.cache_info = {"sequences": len(self.cache), "bytes": self.cache.nbytes}

    def _emit(self, job: Job, event: Any) -> None:
        """A running job's event. Its whole answer is counted served as it is handed over: its
        task ends a turn later (a turn may be another prompt's chunk), and a client that has its
        answer reads /health with it served, not running (a CI run read it between the two)."""
        if isinstance(event, Done):
            stats = getattr(event.result, "stats", None)  # (none for an answer that never decoded)
            with self._lock:
                job.answered, self.served = True, self.served + 1
                if stats is not None:
                    self.constrained["tokens"] += stats.constrained_tokens
                    self.constrained["mask_ms"] = round(self.constrained["mask_ms"] + 1000 * stats.mask_seconds, 2)
        job.emit(event)

    def _finish(self, job: Job, refused: bool = False) -> None:
        """The job ended: answered (whole, cut or failed), or refused at admission."""
        with self._lock:
            if job in self.running:
                self.running.remove(job)
            self.served += not (refused or job.answered)
            self.refused += refused
            self.dropped += job.cancelled.is_set() and not job.answered
        job.emit(END)
