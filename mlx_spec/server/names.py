"""The names a served model answers to.

vLLM's convention: the model's id is the path or hub id it was loaded from, or the names given
with `--served-model-name` (the first is the id answers carry, the others aliases). Agents are
often configured with a short name, so the family's name for the served size (`e2b`, `e4b`,
...) is accepted too, and so is the last part of the path (`gemma-4-e2b-it-4bit`). With
`any_name` (`serve --any-model`), every name is: Claude Code asks for its own model names, and
for a second "small fast" one, unless it is told otherwise.
"""

from typing import Dict, List, Optional, Sequence

from ..models import FAMILIES


class ModelNames:
    def __init__(self, model_id: str, served: Sequence[str] = (), engine=None, any_name: bool = False):
        served = [n for n in dict.fromkeys(served) if n]
        self.id = served[0] if served else model_id
        self.listed: List[str] = served or [model_id]
        size = FAMILIES.size(model_id)
        size_name = size.name if size is not None else engine.pair.size_name if engine is not None else None
        others = [model_id, model_id.rstrip("/").rsplit("/", 1)[-1], size_name]
        self.accepted: List[str] = list(dict.fromkeys([*self.listed, *(n for n in others if n)]))
        self.any_name = any_name
        self.context_window = getattr(engine, "context_length", None)

    def __contains__(self, name: Optional[str]) -> bool:
        return self.any_name or name in self.accepted

    @property
    def in_schema(self) -> Optional[List[str]]:
        """The names /openapi.json lists for `model` (None: any string)."""
        return None if self.any_name else self.accepted

    @property
    def aliases(self) -> List[str]:
        return [n for n in self.accepted if n != self.id]

    def card(self, name: str) -> Dict:
        """A model's card; `context_window` is what agents (Codex, ...) want to know of it."""
        card = {"id": name, "object": "model", "created": 0, "owned_by": "mlx-spec"}
        return {**card, "context_window": self.context_window} if self.context_window else card
