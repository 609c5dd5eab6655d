"""Host work done a piece at a time: a generator that yields between pieces and returns its
result, run piece by piece (`Pieces.step`) or through (`Pieces.finish`), timing only itself.

The loop builds the next cycle in pieces, one after each stage of the running cycle's launch
(see decoding/launch.py): a piece is one draft step, so that the host's work between two stages is about
as long as the part of a stage the device still has to run when its launch returns.
"""

import time
from typing import Generator, Generic, Optional, TypeVar

T = TypeVar("T")
HostWork = Generator[None, None, T]  # yields between pieces, returns the result


class Pieces(Generic[T]):
    def __init__(self, work: HostWork):
        self.work = work
        self.seconds = 0.0  # host time spent in the pieces, not between them
        self.result: Optional[T] = None
        self.done = False

    def step(self) -> bool:
        """Run the next piece; False once the work is done."""
        if self.done:
            return False
        began = time.perf_counter()
        try:
            next(self.work)
        except StopIteration as end:
            self.result, self.done = end.value, True
        finally:
            self.seconds += time.perf_counter() - began
        return not self.done

    def finish(self) -> T:
        while self.step():
            pass
        return self.result

    def close(self) -> None:
        """Stop the work where it is: it gets a GeneratorExit at its last yield (to put back
        what it changed) and runs no further."""
        self.work.close()


def run_through(work: HostWork) -> T:
    return Pieces(work).finish()
