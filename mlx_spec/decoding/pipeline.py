"""The pipelined loop's machinery: cycles put on the device a stage at a time, the next cycle
built between the stages of the running one, and one clock for what each cycle cost and for the
host time the device waited on.

A cycle goes through these phases (`Cycle.launched` counts its launches):
- built: its graph exists, from the settled state (`Pipeline.first`) or ahead, from the running
  cycle's lazy outputs whatever it keeps (`Start.after`, cycle.py);
- staged: some of its draft steps are queued on the device;
- queued: the whole cycle is queued;
- synced: its outputs reached the host (`Pipeline.sync`), and the loop settles its tokens.
A cycle built ahead is dropped unsynced only when the running cycle ends the generation (a stop
token, the budget): its writes lie past the settled positions, and the caches' offsets go back
over them (`SequenceState.trim_to_settled`). Nothing is copied or restored.

Why stages. MLX keeps only about ten tasks in flight and queues the rest of a graph as they
finish (MLX's scheduler in its evaluation code; a task is a Metal command buffer of up to 40-50 kernels or 40-50 MB
of inputs, or ten CPU primitives). So `mx.async_eval` on a cycle of thousands of primitives
returns only once all but its last few hundred are queued, and the host is free only while those
run. A cycle with guesses is therefore launched a draft step at a time, and after each stage the
host builds a piece (a draft step) of the next cycle while the device runs the rest of the stage.
The next cycle's first stage is queued before the running one syncs, so the device never waits
for the host between two cycles.

The clock: every host second of the loop is counted to one cycle (`Cycle.seconds`: building its
pieces, launching its stages, waiting for its sync), which is what the adaptive draft length
weighs, and to the statistics by kind (build, launch, wait); and the host time from a sync to
the next launch, when no cycle was queued, is the exposed host time
(`Stats.exposed_host_seconds`): time the device sat idle waiting for the host.
"""

import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import mlx.core as mx

from ..drafting import Drafter
from ..drafting.pieces import HostWork, Pieces
from .cycle import Cycle, CycleBuilder, Start
from .sequence import SequenceState
from .stats import Stats


@dataclass
class Outcome:
    """A synced cycle: its output tokens (cut at a stop token and at the budget), how many of
    its guesses were kept, its report figures, and whether it ended on a stop token."""

    tokens: List[int]
    kept: int
    figures: Dict[str, list]
    stopped: bool


def outcome(cycle: Cycle, budget: int, stop_tokens) -> Outcome:
    """A synced cycle's output: its kept guesses and the token after them, cut at the budget
    and after the first stop token."""
    kept = cycle.kept.item()
    tokens = cycle.tokens.tolist()[: kept + 1][:budget]
    stopped = False
    for i, token in enumerate(tokens):
        if token in stop_tokens:
            tokens, stopped = tokens[: i + 1], True
            break
    return Outcome(tokens, kept, {k: v.tolist() for k, v in cycle.reports.items()}, stopped)


class Pipeline:
    def __init__(self, builder: CycleBuilder, policy, drafter: Optional[Drafter], stats: Stats, stop_tokens=()):
        self.builder, self.policy, self.drafter, self.stats = builder, policy, drafter, stats
        self.stop_tokens = set(stop_tokens)
        self.synced_at: Optional[float] = None  # when the last sync returned, if nothing was queued then

    def restart(self) -> None:
        """A new generation: nothing is in flight, and the host's wait before it is no cycle's."""
        self.synced_at = None

    def first(self, state: SequenceState, budget: int) -> Cycle:
        """A cycle built from the settled state: at a generation's start, or after a cycle whose
        successor could not be built ahead (its drafter reads the tokens' values)."""
        cycle = self.builder.build(state, Start.settled(state), self.policy.choose(budget), self.drafter)
        self.stats.build_seconds += cycle.seconds
        return cycle

    def advance(self, state: SequenceState, running: Cycle, budget: int) -> Optional[Cycle]:
        """Launch the rest of `running`, building the next cycle ahead of it between its stages,
        and queue the next cycle's first stage. Returns the next cycle, or None where none was
        built (the budget ends with `running`, or the drafter needs the tokens on the host). If
        anything fails on the way, the build is closed and the error goes on (the loop then
        cuts the caches back to the settled tokens)."""
        work = self._next(state, running, budget)
        build = Pieces(work) if work is not None else None
        try:
            while running.stages_left:
                self._stage(running)
                if build is not None:
                    build.step()
            self._stage(running)  # the whole cycle, unless it was launched already
            upcoming = build.finish() if build is not None else None
        except BaseException:
            if build is not None:
                build.close()
            raise
        if upcoming is not None:
            upcoming.seconds += build.seconds
            self.stats.build_seconds += build.seconds
            self._stage(upcoming)  # queued behind `running`: the device goes straight on
        return upcoming

    def sync(self, cycle: Cycle, budget: int, upcoming: Optional[Cycle]) -> Outcome:
        """The cycle's one host synchronisation."""
        began = time.perf_counter()
        mx.eval(cycle.arrays())
        self.stats.host_syncs += 1
        synced = time.perf_counter()
        cycle.seconds += synced - began
        self.stats.waited_seconds += synced - began
        self.synced_at = None if upcoming is not None else synced
        return outcome(cycle, budget, self.stop_tokens)

    def _next(self, state: SequenceState, running: Cycle, budget: int) -> Optional[HostWork]:
        """The next cycle's build, in pieces, from `running`'s lazy outputs."""
        if budget < 2:
            return None  # `running` settles at least one token: the budget ends with it
        # At most budget - 1 tokens are left after `running`: near the end the cycle may draft
        # guesses past the budget, which are cut at the sync.
        g = self.policy.choose(budget - 1)
        drafter = self.drafter.for_ahead(running.source) if g > 0 else None
        if g > 0 and drafter is None:
            self.policy.withdraw()
            return None  # the drafter needs the tokens on the host: the cycle waits for them
        return self.builder.pieces(state, Start.after(state, running), g, drafter)

    def _stage(self, cycle: Cycle) -> None:
        """Queue the cycle's next stage (nothing once the whole cycle is queued)."""
        stage = cycle.next_stage()
        if stage is None:
            return
        if self.synced_at is not None:  # the host work between the last sync and this launch
            self.stats.exposed_host_seconds += time.perf_counter() - self.synced_at
            self.synced_at = None
        began = time.perf_counter()
        mx.async_eval(stage)
        launched = time.perf_counter() - began
        cycle.seconds += launched
        self.stats.launch_seconds += launched
