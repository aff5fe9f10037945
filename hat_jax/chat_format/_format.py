"""The literal strings of the Qwen3.5 chat format, shared by the renderer, the parser and tests.

Qwen3.5 models were trained on exactly these strings (the tool block's instruction text
included), so they are format facts, not style: change one and a real checkpoint sees a prompt
it was never trained on. The Jinja template (`chat_template.jinja`) spells the same strings;
`tests/chat_format` checks that the two render identically.
"""

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"

# The tokens the format itself writes. In a Qwen tokenizer each is one added token, which is what
# lets `render_tokens` rely on the tokenizer splitting text at them.
FORMAT_TOKENS = (
    IM_START,
    IM_END,
    THINK_OPEN,
    THINK_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_RESPONSE_CLOSE,
)

TOOLS_HEADER = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
TOOLS_FOOTER = "\n</tools>"
TOOL_INSTRUCTIONS = (
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
    "Reminder:\n- Function calls MUST follow the specified format: an inner <function=...>"
    "</function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the "
    "function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current "
    "knowledge and do not tell the user about function calls\n</IMPORTANT>"
)

ASSISTANT_HEADER = f"{IM_START}assistant\n"
THINKING_PROMPT = f"{ASSISTANT_HEADER}{THINK_OPEN}\n"
NO_THINKING_PROMPT = f"{ASSISTANT_HEADER}{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"


def generation_prompt(enable_thinking: bool = True) -> str:
    """The assistant header the model continues from.

    With thinking on, the prompt opens the think block and the model writes its reasoning, then
    `</think>`; with thinking off, the prompt holds an empty, closed think block.
    """
    return THINKING_PROMPT if enable_thinking else NO_THINKING_PROMPT
