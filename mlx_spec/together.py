"""Several requests at once over one engine: what `Engine.generate_many`, `Engine.stream_many`
and the server's scheduler (server/worker.py) run.

Each request is a task: a generator of events over the one request path (a `Generation` in a
`Batch`, decoding/batch.py), whose events go to the task's `emit`. A turn (`Together.turn`):
- at most one new task starts: its prompt goes through the target in chunks, and between two
  chunks the tasks already decoding take one step each (`between_chunks`), so that a long
  prompt does not freeze the other conversations;
- every decoding task hands over what its row settled (its generator runs until it says
  WAITING);
- the batch takes one step for every row.
A task's own `stop()` (a client that left) is asked between chunks and between steps; a stopped
task is closed: its row leaves the batch, and its sequence goes back to the prompt cache
consistent, whatever point it was at.

`agree()`, the owner's, is called at the start of each turn and between two chunks: the points
where a group's ranks take rank 0's decisions (server/agreement.py: the tasks to add, the ones
stopped), so that every rank starts, steps and stops the same tasks at the same points.
"""

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

from mlx_lm.generate import wired_limit

from .decoding.batch import Batch
from .decoding.lockstep import lost_peer
from .decoding.reports import WAITING, TokenReport
from .errors import PromptStopped, SettingsError
from .generation import Generation
from .options import Options


@dataclass
class Task:
    events: Optional[Iterator[Any]]  # made at its start (it needs `between_chunks`)
    make: Callable[[Callable[[], bool]], Iterator[Any]]  # between_chunks -> the events
    emit: Callable[[Any], None]  # an event, or the exception that ended the task
    stopped: Callable[[], bool] = lambda: False  # asked between chunks and steps
    decoding: bool = False  # its prompt is in: its events wait on the batch's steps
    done: bool = False
    info: dict = field(default_factory=dict)  # what its owner keeps with it (the server's job)


class Together:
    def __init__(self, engine, agree: Callable[[], None] = lambda: None,
                 fatal: Callable[[BaseException], bool] = lost_peer):
        """fatal: whether an error ends every task rather than the one whose events raised it
        (by default a lost rank of a group; server/agreement.py: also any error that may not
        have arisen on every rank)."""
        self.engine, self.agree, self.fatal = engine, agree, fatal
        self.batch = Batch(engine.target, engine.draft_lengths)
        self.tasks: List[Task] = []

    def add(self, make: Callable[[Callable[[], bool]], Iterator[Any]], emit: Callable[[Any], None],
            stopped: Callable[[], bool] = lambda: False) -> Task:
        """A request, started at a coming turn: `make(stop)` gives its events, where `stop` is
        the callback to pass its Generation (asked between prompt chunks)."""
        task = Task(None, make, emit, stopped)
        self.tasks.append(task)
        return task

    @property
    def busy(self) -> bool:
        return bool(self.tasks)

    @property
    def decoding(self) -> int:
        return sum(t.decoding for t in self.tasks)

    def turn(self) -> None:
        """Start at most one task, hand over every decoding task's events, step the batch."""
        self.agree()
        new = next((t for t in self.tasks if t.events is None), None)
        if new is not None:
            self.batch.interrupt()  # its prompt (the last chunk) runs before the next step
            new.events = new.make(lambda: self._between_chunks(new))
            self._pump(new)
        self._decode_turn()

    def _decode_turn(self) -> None:
        for task in [t for t in self.tasks if t.decoding]:
            self._pump(task)
        self.batch.step()

    def _between_chunks(self, task: Task) -> bool:
        """Between two chunks of `task`'s prompt: the decoding tasks take a step. True: stop it."""
        self.agree()
        if task.stopped():
            return True
        self._decode_turn()
        self.batch.interrupt()  # the next chunk runs before the next step
        return task.stopped()

    def _pump(self, task: Task) -> None:
        """Run a task until it waits on the batch; close it when it ends or was stopped."""
        if task.done:
            return
        try:
            if task.stopped():
                return self._end(task)
            for event in task.events:
                if event is WAITING:
                    task.decoding = True
                    return
                task.emit(event)
                if task.stopped():
                    return self._end(task)
        except PromptStopped:  # it was stopped during its prompt: nobody to tell
            pass
        except Exception as e:  # the request's own error: reported to it, the others go on
            if self.fatal(e):  # not the request's alone: the caller ends every task
                raise
            task.emit(e)
        self._end(task)

    def _end(self, task: Task) -> None:
        task.done = True
        if task.events is not None:
            task.events.close()  # its row leaves the batch, its sequence goes back
        self.tasks.remove(task)

    def close(self) -> None:
        """Close every task (the caller is going away)."""
        for task in list(self.tasks):
            self._end(task)



class Many:
    """Several prompts answered together (`Engine.stream_many`): iterating gives (index of the
    prompt, report) as the answers settle; `results` holds every GenerationResult once the
    iteration ended. An error in one request ends them all (the first is raised)."""

    def __init__(self, engine, prompts, options, tools=None, cache=None):
        if isinstance(prompts, str) or not isinstance(prompts, Iterable):  # ("ab" would be two prompts)
            raise SettingsError("prompts must be a list of prompts; for one prompt use generate or stream")
        prompts = list(prompts)
        options = [options] * len(prompts) if options is None or isinstance(options, Options) else list(options)
        if len(options) != len(prompts):
            raise SettingsError(f"{len(options)} options for {len(prompts)} prompts: give one, or one per prompt")
        self.engine, self.tools, self.cache = engine, tools, cache
        self.together = Together(engine)
        self.generations: List[Optional[Generation]] = [None] * len(prompts)
        self.ready: deque = deque()
        self.error: Optional[BaseException] = None
        for i, (prompt, option) in enumerate(zip(prompts, options)):
            self.together.add(lambda stop, i=i, p=prompt, o=option: self._events(i, p, o, stop),
                              lambda event, i=i: self._emit(i, event), lambda: self.error is not None)

    def _events(self, i: int, prompt, options: Options, stop) -> Iterator[Any]:
        answer = Generation(self.engine, prompt, options, tools=self.tools, cache=self.cache, stop=stop,
                            batch=self.together.batch)
        self.generations[i] = answer
        return iter(answer)

    def _emit(self, i: int, event: Any) -> None:
        if isinstance(event, BaseException):
            self.error = self.error or event
        else:
            self.ready.append((i, event))

    @property
    def results(self) -> List[Any]:
        return [g.result if g is not None else None for g in self.generations]

    def __iter__(self) -> Iterator[Tuple[int, TokenReport]]:
        try:
            with wired_limit(self.engine.target.model):
                while self.together.busy and self.error is None:
                    self.together.turn()
                    while self.ready:
                        yield self.ready.popleft()
            if self.error is not None:
                raise self.error
        finally:
            self.together.close()
