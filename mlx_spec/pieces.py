"""Host work done a piece at a time: a generator that yields between pieces and returns its
result, run piece by piece (`Pieces.step`) or through (`Pieces.finish`), timing only itself.

MLX keeps only a few tasks in flight: `mx.async_eval` on a graph of thousands of primitives
returns once all but the last hundred or so are queued (on a CPU, once they ran). The host is
free only while those last ones run. So the loop builds the next cycle in pieces, each one
between two stages of the running cycle's launch (see `Decoder._launch`): with one piece per
draft step, the device always has the rest of its stage to run while the host builds.
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


def run_through(work: HostWork) -> T:
    return Pieces(work).finish()
