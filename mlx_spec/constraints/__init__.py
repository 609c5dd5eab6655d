"""Answers that must parse: a JSON schema, a regular expression or a Lark grammar per request,
applied to the target's distribution at every verified position, drafting on (matcher.py)."""

from .spec import Grammar, grammar_of

__all__ = ["Grammar", "grammar_of"]
