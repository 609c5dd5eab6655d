"""Draft sources, one per file, behind one base class (base.py): the MTP assistant (mtp.py),
prompt lookup (lookup.py), and a chain of sources tried in order (chain.py)."""

from .base import Custom, Draft, DraftContext, Drafter, as_drafter
from .chain import Chain
from .lookup import PromptLookup
from .mtp import MTPDrafter

__all__ = ["Draft", "DraftContext", "Drafter", "Custom", "as_drafter", "Chain", "PromptLookup", "MTPDrafter"]
