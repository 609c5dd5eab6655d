"""A request as the scheduler (worker.py) holds it: the work its thread runs, the events that
work gives on their way to the event loop, and its cancellation (its client left)."""

import asyncio
import threading
from typing import Any, AsyncIterator, Callable, Iterator

END = object()  # the last of a job's events: its work is over and counted (worker.py)


class Job:
    def __init__(self, work: Callable[..., Iterator[Any]], loop: asyncio.AbstractEventLoop, positions: int = 0):
        self.work = work
        self.loop = loop
        self.positions = positions  # the most positions its sequence may reach (prompt and answer)
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()  # its client left, or the server is stopping
        self.agreed = threading.Event()  # ... as of the last agreement: what its row follows
        self.number = -1  # in the order of admission
        self.answered = False  # its answer was handed over whole: counted served (its task may still end)

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
