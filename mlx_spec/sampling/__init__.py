"""Sampling: the settings (settings.py), the target's sampling distribution (distribution.py),
the acceptance rules (acceptance.py) and the uniforms they draw with (uniforms.py)."""

from .acceptance import accept_by_match, accept_by_ratio
from .distribution import Distribution, distribution, inverse_cdf
from .settings import SamplingSettings, is_integer
from .uniforms import UniformStream, uniform_streams

__all__ = ["SamplingSettings", "is_integer", "Distribution", "distribution", "inverse_cdf", "accept_by_match",
           "accept_by_ratio", "UniformStream", "uniform_streams"]
