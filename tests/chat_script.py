"""The conversations the trained tiny target learns (tests/conftest.py `trained`): a question
answered by two tool calls, the answer from their results, and a greeting answered after a
thought. Rendered with Google's template, as mlx-spec renders them."""

from mlx_spec.models.gemma4.chat_format import for_template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_time",
            "description": "The current time in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
QUESTION = "What time is it in Taipei? And in New York?"
CALLS = (
    '<|tool_call>call:get_current_time{city:<|"|>Taipei<|"|>}<tool_call|>'
    '<|tool_call>call:get_current_time{city:<|"|>New York<|"|>}<tool_call|><|tool_response>'
)
RESULTS = [{"time": "21:04"}, "08:04"]  # a mapping (rendered natively) and a string
ANSWER = "It is 21:04 in Taipei and 08:04 in New York."
GREETING = "Hello there"
THOUGHT = "The user says hello."
HELLO = "Hello! How can I help you today?"


def calls_message(ids=("call_a", "call_b")):
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": ids[0], "type": "function", "function": {"name": "get_current_time", "arguments": {"city": "Taipei"}}},
        {"id": ids[1], "type": "function", "function": {"name": "get_current_time", "arguments": {"city": "New York"}}},
    ]}


def results_messages(ids=("call_a", "call_b")):
    return [{"role": "tool", "tool_call_id": i, "content": r} for i, r in zip(ids, RESULTS)]


QUESTION_MESSAGES = [{"role": "user", "content": QUESTION}]
EXAMPLES = [
    ((QUESTION_MESSAGES, TOOLS, False), CALLS),
    ((QUESTION_MESSAGES + [calls_message()] + results_messages(), TOOLS, False), ANSWER + "<turn|>"),
    (([{"role": "user", "content": GREETING}], None, True), f"<|channel>thought\n{THOUGHT}<channel|>{HELLO}<turn|>"),
]


def render(tokenizer, messages, tools=None, thinking=False):
    return list(tokenizer.apply_chat_template(
        for_template(messages), tools=tools, add_generation_prompt=True, enable_thinking=thinking
    ))


def encode(tokenizer, text):
    return list(tokenizer.encode(text, add_special_tokens=False))
