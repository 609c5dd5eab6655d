"""A forced tool choice, and a response format beside tools, as one grammar: the family's calls
(its chat format's `tool_call_rules`, typed by each tool's schema) and, where the answer may
also be text, the answer's JSON schema beside them.

- `required`: one or more calls, of any of the tools;
- a tool's name: one or more calls of that tool;
- `auto` (or none given) with a JSON schema: one or more calls, or the answer in the schema;
- with thinking on, the family's thought first, free (its chat format's `thought_rule`), then
  what is held (a JSON schema, or the calls).

A family's chat format gives `tool_call_rules(tools, tokenizer)`: its call rule per tool, the
rules they need, and the separator between calls (models/gemma4/tool_grammar.py,
models/qwen3_5/tool_grammar.py).
"""

import json
from typing import Any, List, Optional

from ..errors import SettingsError
from ..message_checks import check_tools
from .spec import Grammar

def check_tool_choice(choice: Any) -> None:
    """A SettingsError for a tool choice that is none of None, "auto", "none", "required" or a
    tool's name."""
    if choice is not None and (not isinstance(choice, str) or not choice.strip()):
        raise SettingsError(f'tool_choice must be "auto", "none", "required" or a tool\'s name, got {choice!r}')


def with_tools(grammar: Optional[Grammar], choice: Optional[str], tools: Optional[List[Any]], chat_format,
               tokenizer, thinking: bool = False) -> Optional[Grammar]:
    """The grammar an answer is held to, given the request's constraint, tool choice, tools and
    whether the model thinks first (the family's thought, free, before what is held)."""
    forced = choice not in (None, "auto", "none")
    calling = forced or (grammar is not None and bool(tools) and choice != "none")
    if not calling and (grammar is None or not thinking):
        return grammar
    if calling:
        body, rules = _calls(grammar, choice, forced, tools, chat_format, tokenizer)
    elif grammar.kind == "json_schema":
        body, rules = _json(grammar), ""
    else:
        raise SettingsError(f"a {grammar.kind} with thinking on is not supported: turn thinking off, or give a json_schema")
    if thinking:
        thought = getattr(chat_format, "thought_rule", None)
        if thought is None:
            raise SettingsError("this model family's thought has no grammar yet: turn thinking off to constrain its answer")
        prefix, more = thought(tokenizer)
        body, rules = f"{prefix} ({body})", f"{rules}\n{more}"
    return Grammar("grammar", f"start: {body}\n{rules}")


def _calls(grammar: Optional[Grammar], choice: Optional[str], forced: bool, tools: Optional[List[Any]], chat_format,
           tokenizer) -> tuple:
    """(the Lark expression of one or more calls, or of them or the JSON answer; their rules)."""
    if not tools:
        raise SettingsError(f'tool_choice "{choice}" needs tools to call')
    try:
        tools = check_tools(tools)
    except ValueError as e:
        raise SettingsError(str(e)) from None
    if any(not isinstance(t, dict) for t in tools):
        raise SettingsError("a forced tool_choice or a response format beside tools needs the tools as declarations "
                            "(JSON schemas), not Python functions")
    names = [t["function"]["name"] for t in tools]
    if forced and choice != "required" and choice not in names:
        raise SettingsError(f"tool_choice names {choice!r}, which is not among the tools ({', '.join(names)})")
    if grammar is not None and grammar.kind != "json_schema":
        raise SettingsError(f"a {grammar.kind} beside tools is not supported: give a json_schema, or no tools")
    rules = getattr(chat_format, "tool_call_rules", None)
    if rules is None:
        raise SettingsError("this model family's tool calls have no grammar yet: a call cannot be forced, nor a "
                            "response format given beside tools")
    calls, text, separator = rules(tools, tokenizer)
    chosen = list(calls.values()) if choice in (None, "auto", "none", "required") else [calls[choice]]
    call = f"({' | '.join(chosen)})"
    body = f"{call} ({separator} {call})*"
    if not forced and grammar is not None:
        body = f"{body} | {_json(grammar)}"
    return body, text


def _json(grammar: Grammar) -> str:
    """A JSON schema as an expression of llguidance's Lark, its JSON compact."""
    schema = {**json.loads(grammar.source), "x-guidance": {"whitespace_flexible": False}}
    return f"%json {json.dumps(schema, ensure_ascii=False)}"
