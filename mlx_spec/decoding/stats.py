"""The statistics of a generation: prompt, tokens, cycles, guesses drafted and kept, and what
the loop itself cost (host synchronisations, cycles launched pre-built, exposed host time)."""

from dataclasses import dataclass, field
from typing import Dict, List


@dataclass
class Stats:
    prompt_length: int = 0  # the prompt's tokens: what the answer follows (a server's usage counts these)
    prompt_tokens: int = 0  # prompt tokens that went through the target (not the last: the first cycle's input)
    prompt_reused: int = 0  # prompt tokens whose keys and values were already in the caches
    media_tokens: int = 0  # soft tokens of images and audio among prompt_tokens
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    cycles: int = 0
    drafted: int = 0
    kept: int = 0
    kept_by_position: List[int] = field(default_factory=list)  # [i]: cycles that kept guess i + 1
    cycles_by_g: Dict[int, int] = field(default_factory=dict)  # cycles per number of guesses
    kept_by_source: Dict[str, int] = field(default_factory=dict)  # kept guesses per drafter
    drafted_by_source: Dict[str, int] = field(default_factory=dict)
    host_syncs: int = 0  # synchronisations in the decoding cycles
    prebuilt: int = 0  # cycles built while the one before them ran, then launched at once
    exposed_host_seconds: float = 0.0  # host time from a sync to the next cycle's first launch
    # Host time spent waiting in the syncs: while it is well above zero, the device had work
    # queued all along (the host was ahead of it), and a deeper pipeline could not make it faster.
    waited_seconds: float = 0.0
    # Host time building cycles' graphs, and launching them (`mx.async_eval`). Where the backend
    # runs each primitive's launch on the host thread (MLX's CPU backend does), the launch holds
    # the host for about as long as the device computes, and the build adds to the cycle's time
    # (docs/benchmarks.md: what bounds the loop efficiency on the CPU).
    build_seconds: float = 0.0
    launch_seconds: float = 0.0
    peak_memory_gb: float = 0.0
    constrained_tokens: int = 0  # tokens generated under a constraint (a schema, a grammar, a forced call)
    mask_seconds: float = 0.0  # host time building a constraint's masks (constraints/matcher.py)

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def generation_tps(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds else 0.0

    @property
    def acceptance(self) -> float:
        return self.kept / self.drafted if self.drafted else 0.0

    @property
    def exposed_host_ms(self) -> float:
        """Exposed host time per cycle after the first, in milliseconds."""
        return 1000 * self.exposed_host_seconds / (self.cycles - 1) if self.cycles > 1 else 0.0

    @property
    def waited_ms(self) -> float:
        """Host time waiting in the syncs per cycle, in milliseconds."""
        return self._per_cycle_ms(self.waited_seconds)

    @property
    def build_ms(self) -> float:
        """Host time building a cycle's graph, per cycle, in milliseconds."""
        return self._per_cycle_ms(self.build_seconds)

    @property
    def launch_ms(self) -> float:
        """Host time in a cycle's launches, per cycle, in milliseconds."""
        return self._per_cycle_ms(self.launch_seconds)

    def _per_cycle_ms(self, seconds: float) -> float:
        return 1000 * seconds / self.cycles if self.cycles else 0.0

    @property
    def prebuilt_share(self) -> float:
        return self.prebuilt / (self.cycles - 1) if self.cycles > 1 else 0.0

    @property
    def mean_g(self) -> float:
        return self.drafted / self.cycles if self.cycles else 0.0

    def to_dict(self) -> Dict:
        out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.__dict__.items()}
        out.update(prompt_tps=self.prompt_tps, generation_tps=self.generation_tps, acceptance=self.acceptance,
                   exposed_host_ms=self.exposed_host_ms, prebuilt_share=self.prebuilt_share,
                   waited_ms=self.waited_ms, build_ms=self.build_ms, launch_ms=self.launch_ms)
        return out

    def count(self, g: int, source: str, kept: int, emitted: int) -> None:
        """A settled cycle: g guesses from `source`, `kept` of them kept, `emitted` tokens."""
        self.cycles += 1
        self.drafted += g
        self.kept += kept
        self.generated_tokens += emitted
        self.cycles_by_g[g] = self.cycles_by_g.get(g, 0) + 1
        if g:
            self.drafted_by_source[source] = self.drafted_by_source.get(source, 0) + g
            self.kept_by_source[source] = self.kept_by_source.get(source, 0) + kept
        if len(self.kept_by_position) < g:
            self.kept_by_position += [0] * (g - len(self.kept_by_position))
        for i in range(kept):
            self.kept_by_position[i] += 1
