"""Sampling settings: temperature, top-k, top-p and the seed, checked once."""

import math
import numbers
from dataclasses import dataclass, replace
from typing import Optional

from ..errors import SettingsError

# The smallest temperature that samples: float32 logits divided by less overflow to infinity
# (a logit of 30 by 1e-38), and their distribution would be NaN. 0 is greedy.
MIN_TEMPERATURE = 1e-30


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k
    top_p: float = 1.0  # 1.0: no top-p
    seed: Optional[int] = None

    def __post_init__(self):
        if not (is_real(self.temperature) and self.temperature >= 0 and math.isfinite(self.temperature)):
            raise SettingsError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise SettingsError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {self.temperature!r}")
        if not is_integer(self.top_k) or self.top_k < 0:
            raise SettingsError(f"top_k must be an integer >= 0 (0 turns it off), got {self.top_k!r}")
        if not (is_real(self.top_p) and 0 < self.top_p <= 1):
            raise SettingsError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (not is_integer(self.seed) or not 0 <= self.seed < 2**64):
            raise SettingsError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        object.__setattr__(self, "top_k", int(self.top_k))
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))

    def unseeded(self) -> "SamplingSettings":
        """The same settings without the seed: what a compiled graph depends on (the seed only
        picks the uniforms, which are its inputs)."""
        return replace(self, seed=None)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def named(cls, name: str, seed: Optional[int] = None) -> "SamplingSettings":
        """'greedy', or 'gemma': Gemma's default decoding settings (1.0 / 64 / 0.95)."""
        presets = {"greedy": (0.0, 0, 1.0), "gemma": (1.0, 64, 0.95)}
        if name not in presets:
            raise SettingsError(f"unknown sampling preset {name!r}; choose from {', '.join(presets)}")
        temperature, top_k, top_p = presets[name]
        return cls(temperature, top_k, top_p, seed)


def is_integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
