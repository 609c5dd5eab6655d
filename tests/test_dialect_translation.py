"""The Responses and Messages requests as the chat requests they become, for the shapes Codex CLI
0.171 and Claude Code 2.1 send by default (seen on the wire against this server), and the
refusals of what exact decoding cannot honour. (The routes end to end: test_dialects.py.)"""

import pytest
from pydantic import ValidationError

from mlx_spec.media.prompt import PLACE, RETURNED
from mlx_spec.server.messages_api import CountTokens, CreateMessage
from mlx_spec.server.responses_api import ResponsesRequest

FUNCTION = {"type": "function", "name": "exec_command", "description": "Runs a command",
            "strict": False, "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}


def codex_request(**fields):
    """Codex's first request of a session: developer messages, the environment and the task
    as user messages, function tools beside a namespace of tools and web search."""
    return {
        "model": "gemma", "stream": True, "tool_choice": "auto", "parallel_tool_calls": True, "store": False,
        "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
        "tools": [FUNCTION, {"type": "namespace", "name": "multi_agent_v1", "tools": []}, {"type": "web_search"}],
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Skills."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<env/>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files"}]},
        ],
        **fields,
    }


def test_codex_s_request_becomes_one_system_message_and_its_function_tools():
    chat, ignored = ResponsesRequest.model_validate(codex_request()).to_chat()
    assert chat.messages[0] == {"role": "system", "content": "You are Codex.\n\nSkills."}
    assert [m["role"] for m in chat.messages] == ["system", "user", "user"]
    assert [t["function"]["name"] for t in chat.tools] == ["exec_command"] and ignored == ["namespace", "web_search"]
    assert chat.thinking is True and chat.stream is True  # (a reasoning without an effort: OpenAI's default, medium)


def test_codex_s_next_turn_gives_back_its_reasoning_calls_and_outputs():
    """The second turn resends everything: the reasoning item and the call join the assistant
    message, the output becomes a tool message answering the call."""
    turn = codex_request()["input"] + [
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Run ls."}],
         "encrypted_content": None},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "exec_command", "arguments": '{"cmd": "ls"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "README.md"},
    ]
    chat, _ = ResponsesRequest.model_validate(codex_request(input=turn)).to_chat()
    assistant, tool = chat.messages[-2:]
    assert assistant["reasoning"] == "Run ls." and assistant["content"] == ""
    assert assistant["tool_calls"][0]["function"] == {"name": "exec_command", "arguments": {"cmd": "ls"}}
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "README.md"}


@pytest.mark.parametrize("fields, words", [
    ({"previous_response_id": "resp_1"}, "previous_response_id is not supported"),
    ({"text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
    ({"input": []}, "input is empty"),
])
def test_responses_refuses_by_name(fields, words):
    with pytest.raises(ValidationError, match=words):
        ResponsesRequest.model_validate(codex_request(**fields))


@pytest.mark.parametrize("item, words", [
    ({"type": "message", "role": "tool", "content": "x"}, "role must be one of"),
    ({"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "f"}]}, "input_file"),
    ({"type": "function_call", "name": "f", "call_id": "c", "arguments": "{not json"}, "not valid JSON"),
    ({"type": "web_search_call"}, "web_search_call"),
])
def test_responses_input_that_cannot_be_translated_is_named(item, words):
    with pytest.raises(ValueError, match=words):
        ResponsesRequest.model_validate(codex_request(input=[{"role": "user", "content": "Hi"}, item])).to_chat()


def claude_request(**fields):
    """Claude Code's request: system blocks with cache_control, a user turn of text blocks, its
    environment as a `system` message among the turns, adaptive thinking, tools with
    input_schema (one deferred), and fields mlx-spec has no use for."""
    return {
        "model": "claude-opus-5-5", "max_tokens": 128000, "stream": True,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
                   {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>r</system-reminder>"},
                                         {"type": "text", "text": "Hello there"}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}]},
        ],
        "tools": [{"name": "Bash", "description": "Run", "input_schema": {"type": "object", "properties": {}}},
                  {"name": "Placeholder", "description": "never", "input_schema": {"type": "object"}, "defer_loading": True},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "medium"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": "u"},
        **fields,
    }


def test_claude_code_s_request_becomes_one_system_message_and_its_tools():
    request = CreateMessage.model_validate(claude_request())
    chat = request.to_chat()
    # (its billing header left out: it changes with each session, and would part their prompts at
    # their start: a review measured 27 s against 0.2 s for an 11.5k-token prompt resumed)
    assert chat.messages[0] == {"role": "system", "content": "You are Claude Code.\n\n# Environment"}
    assert chat.messages[1:] == [{"role": "user", "content": "<system-reminder>r</system-reminder>Hello there"}]
    assert [t["function"]["name"] for t in chat.tools] == ["Bash", "Placeholder"]
    assert request.function_tools()[1] == ["web_search_20250305"]
    assert chat.thinking is True and chat.max_tokens == 128000


def test_a_tool_use_turn_and_its_results_become_calls_and_tool_messages():
    messages = [
        {"role": "user", "content": "List the files"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Run ls.", "signature": ""},
                                          {"type": "text", "text": "Listing."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"cmd": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                      "content": [{"type": "text", "text": "denied"}]},
                                     {"type": "text", "text": "Try again"}]},
    ]
    chat = CreateMessage.model_validate(claude_request(messages=messages, system=None)).to_chat()
    assistant, tool, user = chat.messages[1:]
    assert assistant["reasoning"] == "Run ls." and assistant["content"] == "Listing."
    assert assistant["tool_calls"] == [{"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": {"cmd": "ls"}}}]
    assert tool == {"role": "tool", "tool_call_id": "toolu_1", "content": {"error": "denied"}}  # rendered natively
    assert user == {"role": "user", "content": "Try again"}


def test_images_come_as_image_parts():
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"}}
    chat = CreateMessage.model_validate(claude_request(messages=[{"role": "user", "content": [image, {"type": "text", "text": "What?"}]}])).to_chat()
    # (an error in it names the client's own place: the media module's PLACE)
    assert chat.messages[-1]["content"][0] == {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"},
                                               PLACE: "messages[0].content[0]"}


@pytest.mark.parametrize("fields, words", [
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"messages": []}, "messages"),
])
def test_messages_refuses_by_name(fields, words):
    with pytest.raises(ValidationError, match=words):
        CreateMessage.model_validate(claude_request(**fields))


def test_max_tokens_is_required_to_create_but_not_to_count():
    body = claude_request()
    del body["max_tokens"]
    with pytest.raises(ValidationError, match="max_tokens"):
        CreateMessage.model_validate(body)
    assert CountTokens.model_validate(body).to_chat().messages[-1]["role"] == "user"


@pytest.mark.parametrize("message, words", [
    ({"role": "tool", "content": "x"}, "role must be user, assistant or system"),
    ({"role": "user", "content": [{"type": "document", "source": {}}]}, r"content\[0\].source must be an object of type"),
    ({"role": "user", "content": [{"type": "search_result", "source": "x"}]}, "search_result"),
    ({"role": "assistant", "content": [{"type": "tool_use", "name": "Bash"}]}, "needs id and name"),
    ({"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}, "source must be"),
    ({"role": "user", "content": 3}, "content must be"),
])
def test_messages_that_cannot_be_translated_are_named(message, words):
    request = CreateMessage.model_validate(claude_request(messages=[{"role": "user", "content": "Hi"}, message]))
    with pytest.raises(ValueError, match=words):
        request.to_chat()


def test_a_tool_result_s_image_follows_the_tool_messages_as_a_user_image():
    """Claude Code's Read of an image returns it in the tool_result; Google's template writes a
    tool response's text only, so the image follows the results, where the model sees it."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    messages = [
        {"role": "user", "content": "Look at both"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a.png"}},
                                          {"type": "tool_use", "id": "t2", "name": "Read", "input": {"path": "b.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [image]},
                                     {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "hi"}]}]},
    ]
    chat = CreateMessage.model_validate(claude_request(messages=messages, system=None)).to_chat()
    first, second, shown = chat.messages[-3:]
    assert first == {"role": "tool", "tool_call_id": "t1", "content": ""}
    assert second == {"role": "tool", "tool_call_id": "t2", "content": "hi"}
    assert shown == {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"},
                                                  PLACE: "messages[2].content[0].content[0]", RETURNED: True}]}


def test_a_function_call_output_s_image_follows_the_outputs_as_a_user_image():
    """Codex's view_image returns the image in its function_call_output."""
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    turn = codex_request()["input"] + [
        {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": '{"path": "a.png"}'},
        {"type": "function_call", "call_id": "c2", "name": "exec_command", "arguments": '{"cmd": "ls"}'},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "a.png"}, image]},
        {"type": "function_call_output", "call_id": "c2", "output": "README.md"},
        {"type": "message", "role": "user", "content": "And now?"},
    ]
    chat, _ = ResponsesRequest.model_validate(codex_request(input=turn)).to_chat()
    assert [m["role"] for m in chat.messages[-5:]] == ["assistant", "tool", "tool", "user", "user"]
    assert chat.messages[-4]["content"] == "a.png" and chat.messages[-3]["content"] == "README.md"
    place = f"input[{len(turn) - 3}].output[1]"
    assert chat.messages[-2]["content"] == [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}, PLACE: place,
                                          RETURNED: True}]


def test_a_thought_without_a_call_stays_in_its_own_turn():
    """A reasoning item before an answer (no call) is that answer's: a later turn's call does not
    take it (the template would write it into the new turn, and the prompt cache would miss)."""
    turn = codex_request()["input"] + [
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "OLD"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
        {"type": "message", "role": "user", "content": "Now list them"},
        {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "x"},
    ]
    chat, _ = ResponsesRequest.model_validate(codex_request(input=turn)).to_chat()
    assert "reasoning" not in chat.messages[-2] and chat.messages[-2]["tool_calls"]


def test_without_a_thinking_setting_the_server_s_default_holds():
    """`serve --thinking` is the default of requests that leave it out, in every dialect."""
    from mlx_spec.options import Options

    thinking = Options(thinking=True)
    request = dict(claude_request())
    del request["thinking"]
    assert CreateMessage.model_validate(request).to_chat().options(thinking).thinking is True
    assert CreateMessage.model_validate(claude_request(thinking={"type": "disabled"})).to_chat().options(thinking).thinking is False
    chat, _ = ResponsesRequest.model_validate(codex_request(reasoning=None)).to_chat()
    assert chat.options(thinking).thinking is True and chat.options(Options()).thinking is False
    chat, _ = ResponsesRequest.model_validate(codex_request(reasoning={"effort": "none"})).to_chat()
    assert chat.options(thinking).thinking is False
    chat, _ = ResponsesRequest.model_validate(codex_request(reasoning={"effort": "low"})).to_chat()
    assert chat.options(Options()).thinking is True


DEEP = "[" * 100000


@pytest.mark.parametrize("item, words", [
    ({"type": "message", "role": ["user"], "content": "x"}, "role must be one of"),
    ({"type": "reasoning", "content": 5}, "must be lists of parts"),
    ({"type": "function_call", "name": "f", "call_id": "c", "arguments": DEEP}, "nested deeper than 64"),
    ({"type": "function_call", "name": "f", "call_id": "c", "arguments": '{"a": NaN}'}, "not finite"),
])
def test_input_of_the_wrong_shape_is_named_not_a_server_error(item, words):
    """Each of these raised a TypeError or a RecursionError: a 500."""
    with pytest.raises(ValueError, match=words):
        ResponsesRequest.model_validate(codex_request(input=[{"role": "user", "content": "Hi"}, item])).to_chat()


def test_a_tool_result_too_deep_for_the_template_is_its_text():
    """A tool result that is JSON is rendered natively, unless it nests deeper than a body may:
    then it is the text it is (the template renders a value recursively)."""
    deep = '{"a":' * 900 + "1" + "}" * 900
    results = [deep, '{"a": {"b": 1}}', DEEP]
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "f", "input": {}} for i in range(3)]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": r} for i, r in enumerate(results)]}]
    chat = CreateMessage.model_validate(claude_request(messages=messages, system=None)).to_chat()
    assert [m["content"] for m in chat.messages[-3:]] == [deep, {"a": {"b": 1}}, DEEP]


ANSWERED = [{"role": "user", "content": "List the files"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]}]


@pytest.mark.parametrize("message, words", [
    # Each of these was written into the prompt as Python's text of it ("None", "{'a': 1}").
    ({"role": "user", "content": [{"type": "text", "text": None}]}, r"messages\[1\].content\[0\].text must be a string, got null"),
    ({"role": "user", "content": [{"type": "text", "text": {"a": 1}}]}, "text must be a string, got an object"),
    ({"role": "user", "content": [{"type": "text"}]}, r"content\[0\] needs text, a string"),
    ({"role": "assistant", "content": [{"type": "thinking", "thinking": 5}]}, "thinking must be a string, got a number"),
    # A result answering no call was named in the chat request's terms (`messages[3]`, `tool_call_id`).
    ({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "WRONG", "content": "x"}]},
     r"messages\[1\].content\[0\].tool_use_id 'WRONG' answers no tool_use block"),
])
def test_messages_content_is_checked_in_the_dialect_s_own_fields(message, words):
    """Found by a review of the server (mixed dialects at once)."""
    request = CreateMessage.model_validate(claude_request(messages=[{"role": "user", "content": "Hi"}, message]))
    with pytest.raises(ValueError, match=words):
        request.to_chat()
    answered = ANSWERED + [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a"}]}]
    assert CreateMessage.model_validate(claude_request(messages=answered)).to_chat().messages[-1]["role"] == "tool"


@pytest.mark.parametrize("fields, words", [
    ({"system": [{"type": "text", "text": None}]}, r"system.content\[0\].text must be a string, got null"),
    ({"tools": [{"name": "Bash"}]}, r"tools\[0\].input_schema must be a JSON schema object"),
    ({"tools": [{"name": "Bash", "input_schema": {"type": "object", "properties": []}}]},
     r"tools\[0\].input_schema.properties must map"),
    ({"thinking": {"type": "enabled", "budget_tokens": "x"}}, "thinking.budget_tokens must be a whole number"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type must be"),
    ({"stop_sequences": [""]}, "stop_sequences must not hold empty strings"),
])
def test_messages_settings_and_tools_are_named_as_anthropic_names_them(fields, words):
    with pytest.raises(ValueError, match=words):
        CreateMessage.model_validate(claude_request(**fields)).to_chat()


@pytest.mark.parametrize("fields, words", [
    ({"reasoning": {"effort": 5}}, "reasoning.effort must be one of none, minimal"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "required": "x"}}]},
     r"tools\[0\].parameters.required must be a list"),
    ({"tools": [{"type": "function", "parameters": {}}]}, r"tools\[0\].name must be a non-empty string"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
     r"input\[0\].content\[0\].text must be a string, got a number"),
    ({"input": [{"role": "user", "content": "Hi"}, {"type": "function_call_output", "call_id": "WRONG", "output": "x"}]},
     r"input\[1\].call_id 'WRONG' answers no function_call"),
])
def test_responses_fields_are_named_as_openai_names_them(fields, words):
    with pytest.raises(ValueError, match=words):
        ResponsesRequest.model_validate(codex_request(**fields)).to_chat()


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"anything": True}},
    {"type": "object", "properties": {"xs": {"type": "array", "items": True}}},
    {"type": "object", "properties": {"point": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
                                                "items": False, "minItems": 2, "maxItems": 2}}},
    {"type": "object", "properties": {"point": {"type": "array", "items": [{"type": "number"}, {"type": "string"}]}}},
    {"type": "object", "properties": {"name": {"type": "string", "required": True}}},
])
def test_json_schema_an_mcp_server_may_send_is_taken_in_both_dialects(schema):
    """Claude Code passes an MCP server's tool schemas on as they are: boolean schemas, tuples and
    draft 3's `required: true` are JSON Schema, and Google's template renders them. Each was a
    400 on every request of the session (found by a review with a real MCP server)."""
    claude = CreateMessage.model_validate(claude_request(tools=[{"name": "move", "input_schema": schema}])).to_chat()
    assert claude.tools[0]["function"]["parameters"] == schema
    codex, _ = ResponsesRequest.model_validate(codex_request(
        tools=[{"type": "function", "name": "move", "parameters": schema}])).to_chat()
    assert codex.tools[0]["function"]["parameters"] == schema


def test_a_schema_that_is_no_schema_is_still_named():
    bad = {"type": "object", "properties": {"xs": {"type": "array", "items": 5}}}
    with pytest.raises(ValueError, match=r"tools\[0\].input_schema.properties.xs.items must be a JSON schema object"):
        CreateMessage.model_validate(claude_request(tools=[{"name": "move", "input_schema": bad}])).to_chat()
    with pytest.raises(ValueError, match=r"tools\[0\].input_schema must be a JSON schema object"):
        CreateMessage.model_validate(claude_request(tools=[{"name": "move", "input_schema": True}])).to_chat()


def test_a_document_and_tool_references_in_claude_code_s_turns_are_text():
    """Claude Code's Read of a PDF returns a `document` block, and its ToolSearch `tool_reference`
    blocks; each was a 400, and the session's every later turn carries them again (found by a
    review with the real Claude Code). A plain-text document is its text; another, a note."""
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0x"}}
    text = {"type": "document", "title": "notes", "source": {"type": "text", "media_type": "text/plain", "data": "Buy milk."}}
    turn = ANSWERED + [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "PDF file read"}, pdf]}]},
        {"role": "assistant", "content": "Read."}, {"role": "user", "content": [text, {"type": "text", "text": "And?"}]}]
    chat = CreateMessage.model_validate(claude_request(messages=turn)).to_chat()
    result = next(m for m in chat.messages if m["role"] == "tool")
    assert result["content"] == ("PDF file read[a document (application/pdf) is attached here; this model reads no "
                                 "documents of that kind]")
    assert chat.messages[-1]["content"] == "notes\n\nBuy milk.And?"
    search = ANSWERED + [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
        {"type": "tool_reference", "tool_name": "WebFetch"}, {"type": "tool_reference", "tool_name": "Grep"}]}]}]
    chat = CreateMessage.model_validate(claude_request(messages=search)).to_chat()
    assert next(m for m in chat.messages if m["role"] == "tool")["content"] == "[tool: WebFetch][tool: Grep]"
