"""A loaded target and its drafter, with where they came from and the family they belong to."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from .checkpoint import Checkpoint
from .registry import Family


@dataclass
class ModelPair:
    family: Family
    target: Any  # models.protocol.TargetModel
    assistant: Optional[Any] = None  # models.protocol.DraftModel; None: the target alone
    target_checkpoint: Optional[Checkpoint] = None  # None for a target made in memory
    drafter_checkpoint: Optional[Checkpoint] = None

    @property
    def target_path(self) -> Optional[Path]:
        return self.target_checkpoint.path if self.target_checkpoint else None

    @property
    def drafter_path(self) -> Optional[Path]:
        return self.drafter_checkpoint.path if self.drafter_checkpoint else None

    @property
    def target_config(self) -> dict:
        return self.target_checkpoint.config if self.target_checkpoint else {}

    @property
    def size_name(self) -> Optional[str]:
        """The family's short name for the target's size (e2b, ...), where it has one."""
        return self.family.size_of(self.target)
