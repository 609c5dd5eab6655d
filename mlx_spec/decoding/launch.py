"""Steps put on the device a stage at a time, the next step built between the stages of the
running one, and one clock for what each step cost and for the host time the device waited on.

A step goes through these phases (`Step.launched` counts its launches):
- built: its graph exists, from the settled rows or ahead, from the running step's lazy outputs
  whatever it keeps (`Start.after`, cycle.py);
- staged: some of its draft steps are queued on the device;
- queued: the whole step is queued;
- synced: its outputs reached the host (`Launcher.sync`), and the batch settles its rows.
A step built ahead is dropped unsynced only when none of its rows can use it (they finished or
left): its writes lie past the settled positions, and the caches' offsets go back over them
(`SequenceState.trim_to_settled`). Nothing is copied or restored.

Why stages: see batch.py. The next step's first stage is queued before the running one syncs,
so the device never waits for the host between two steps.

The clock: every host second of the loop is counted to one step (`Step.seconds`: building its
pieces, launching its stages, waiting for its sync), which is what the draft lengths weigh, and
to each of its rows' statistics by kind (build, launch, wait); and the host time from a sync to
the next launch, when no step was queued, is the exposed host time
(`Stats.exposed_host_seconds`): time the device sat idle waiting for the host.
"""

import time
from typing import Optional

import mlx.core as mx

from ..drafting.pieces import HostWork, Pieces
from .batch_step import Step


class Launcher:
    def __init__(self):
        self.synced_at: Optional[float] = None  # when the last sync returned, if nothing was queued then

    def build(self, work: HostWork) -> Optional[Step]:
        """A step built at once (from the settled rows)."""
        pieces = Pieces(work)
        step = pieces.finish()
        if step is not None:
            charge(step, "build_seconds", pieces.seconds)
        return step

    def advance(self, running: Step, work: Optional[HostWork]) -> Optional[Step]:
        """Launch the rest of `running`, building the next step (`work`) between its stages, and
        queue the next step's first stage. Returns the next step, or None where none was built.
        If anything fails on the way, the build is closed and the error goes on (the batch then
        cuts every row back to its settled tokens)."""
        build = Pieces(work) if work is not None else None
        try:
            while running.stages_left:
                self._stage(running)
                if build is not None:
                    build.step()
            self._stage(running)  # the whole step, unless it was launched already
            upcoming = build.finish() if build is not None else None
        except BaseException:
            if build is not None:
                build.close()
            raise
        if upcoming is not None:
            charge(upcoming, "build_seconds", build.seconds)
            self._stage(upcoming)  # queued behind `running`: the device goes straight on
        return upcoming

    def sync(self, step: Step, upcoming: Optional[Step]) -> None:
        """The step's one host synchronisation."""
        began = time.perf_counter()
        mx.eval(step.arrays())
        synced = time.perf_counter()
        charge(step, "waited_seconds", synced - began)
        self.synced_at = None if upcoming is not None else synced

    def _stage(self, step: Step) -> None:
        """Queue the step's next stage (nothing once the whole step is queued)."""
        stage = step.next_stage()
        if stage is None:
            return
        if self.synced_at is not None:  # the host work between the last sync and this launch
            exposed = time.perf_counter() - self.synced_at
            for member in step.stepping:
                member.row.decoder.stats.exposed_host_seconds += exposed
            self.synced_at = None
        began = time.perf_counter()
        mx.async_eval(stage)
        charge(step, "launch_seconds", time.perf_counter() - began)


def charge(step: Step, kind: str, seconds: float) -> None:
    """Count host time to the step, and to its rows' statistics under `kind`."""
    step.seconds += seconds
    for member in step.stepping:
        stats = member.row.decoder.stats
        setattr(stats, kind, getattr(stats, kind) + seconds)
