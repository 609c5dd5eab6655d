"""Putting cycles on the device: a stage at a time, with the next cycle built in between.

MLX keeps only about ten tasks in flight and queues the rest of a graph as they finish
(mlx/transforms.cpp; a task is a Metal command buffer of up to 40-50 kernels or 40-50 MB of
inputs, or ten CPU primitives). So `mx.async_eval` on a cycle of thousands of primitives returns
only once all but its last few hundred are queued, and the host is free only while those run.
A cycle with guesses is therefore launched a draft step at a time, and after each stage the host
builds a piece of the next cycle (see pieces.py) while the device runs the rest of the stage.
"""

import time
from typing import Optional

import mlx.core as mx

from .cycle import Cycle
from .pieces import Pieces
from .stats import Stats


class Launcher:
    def __init__(self, stats: Stats):
        self.stats = stats
        self.synced_at: Optional[float] = None  # when the last sync returned, until a launch

    def launch(self, cycle: Cycle, build: Optional[Pieces] = None) -> None:
        """Launch the rest of `cycle`, running a piece of `build` after each draft step's stage,
        then the rest of `build` (whose result the caller takes from it). If anything fails on
        the way, `build` is closed, so that it puts back what it changed, and the error goes on."""
        try:
            while cycle.steps_to_launch:
                self.stage(cycle)
                if build is not None:
                    build.step()
            self.stage(cycle)  # the whole cycle, unless it was launched already
            if build is not None:
                build.finish()
        except BaseException:
            if build is not None:
                build.close()
            raise

    def stage(self, cycle: Cycle) -> None:
        """Queue the cycle's next stage (nothing once the whole cycle is queued)."""
        stage = cycle.next_stage()
        if stage is None:
            return
        if self.synced_at is not None:  # the host work between the last sync and this launch
            self.stats.exposed_host_seconds += time.perf_counter() - self.synced_at
            self.synced_at = None
        began = time.perf_counter()
        mx.async_eval(stage)
        cycle.seconds += time.perf_counter() - began
