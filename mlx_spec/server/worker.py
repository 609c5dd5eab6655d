"""The queue in front of the one model.

One thread owns the model: it loads it (MLX arrays belong to the stream of the thread that made
them) and runs every MLX computation, one request at a time, so the event loop stays free to read
and answer other connections. A request is a `Job`: a function the
thread calls with the engine, the prompt cache and a function that says whether the job was
cancelled (asked between a long prompt's chunks), returning a generator of events. The events
reach the event loop through an asyncio queue. Cancelling a job (its client left) closes its
generator after the current event: the engine's stream closes, the sequence goes back to the
prompt cache consistent, and the next job starts.
"""

import asyncio
import queue
import threading
from typing import Any, AsyncIterator, Callable, Iterator, Optional

from ..decoding.prompt_cache import PromptCache

END = object()


class Job:
    def __init__(self, work: Callable[[Any, Any], Iterator[Any]], loop: asyncio.AbstractEventLoop):
        self.work = work
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, event: Any) -> None:
        """From the worker thread: hand an event to the event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server is shutting down
            self.cancel()

    async def __aiter__(self) -> AsyncIterator[Any]:
        """The job's events; an exception raised by its work is raised here."""
        while True:
            event = await self.events.get()
            if event is END:
                return
            if isinstance(event, BaseException):
                raise event
            yield event


class Worker:
    """One thread running jobs in order over one engine and one prompt cache."""

    def __init__(self, load: Callable[[], Any], cache_bytes: int):
        """load: makes the Engine, on the model's thread; its errors are raised here."""
        self.engine, self.cache, self._load_error = None, None, None
        self.jobs: "queue.Queue[Optional[Job]]" = queue.Queue()
        self.waiting = 0  # jobs submitted and not started
        self.running = 0  # 1 while a job runs
        self.current: Optional[Job] = None
        self.served = 0
        self.dropped = 0  # jobs whose client left
        self.cache_info = {"sequences": 0, "bytes": 0}
        self._lock = threading.RLock()  # re-entrant: a signal handler may cancel jobs
        loaded = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(load, cache_bytes, loaded), name="mlx-spec-model", daemon=True)
        self.thread.start()
        loaded.wait()
        if self._load_error is not None:
            raise self._load_error

    def submit(self, work: Callable[[Any, Any], Iterator[Any]]) -> Job:
        job = Job(work, asyncio.get_running_loop())
        with self._lock:
            self.waiting += 1
        self.jobs.put(job)
        return job

    def status(self) -> dict:
        with self._lock:
            return {"running": self.running, "waiting": self.waiting, "served": self.served,
                    "dropped": self.dropped, "prompt_cache": dict(self.cache_info)}

    def cancel_all(self) -> None:
        """Cancel the running job (after its current event) and every waiting one."""
        with self._lock:
            jobs = [self.current, *list(self.jobs.queue)]
        for job in jobs:
            if job is not None:
                job.cancel()

    def close(self, timeout: float = 10.0) -> None:
        """Cancel every job and stop the thread."""
        self.cancel_all()
        self.jobs.put(None)
        self.thread.join(timeout)

    def _run(self, load, cache_bytes: int, loaded: threading.Event) -> None:
        try:
            self.engine = load()
            self.cache = PromptCache(self.engine.target, cache_bytes)
        except BaseException as e:
            self._load_error = e
            return
        finally:
            loaded.set()
        while True:
            job = self.jobs.get()
            if job is None:
                return
            with self._lock:
                self.waiting -= 1
                self.running, self.current = 1, job
            finished = False
            try:
                finished = self._do(job)
            finally:
                with self._lock:
                    self.running, self.current = 0, None
                    self.served += 1
                    self.dropped += not finished
                    self.cache_info = {"sequences": len(self.cache), "bytes": self.cache.nbytes}
                job.emit(END)

    def _do(self, job: Job) -> bool:
        """Run a job; False when it was cancelled before its end."""
        if job.cancelled.is_set():
            return False
        events = None
        try:
            events = job.work(self.engine, self.cache, job.cancelled.is_set)
            for event in events:
                if job.cancelled.is_set():
                    return False
                job.emit(event)
            return True
        except Exception as e:  # reported to the request; the worker goes on
            job.emit(e)
            return True
        finally:
            if events is not None:
                events.close()  # closes the engine's stream: the cache stays consistent
