"""The task of ``rollforge bench vs-trl``: a TRL ``environment_factory`` class, its prompts, the chat
template both trainers use, and scripted episodes to warm a model up on.

``GuessNumber`` has two tools, ``guess(number)`` and ``hint(kind)``, and owns its reward
(``get_reward()``: 1 when a guess was right). It has no ``done`` attribute, so both trainers end an
episode the same way: when the model answers without a tool call, or at the tool-call limit.

The template is TRL 1.16's shipped Qwen2.5 template, copied verbatim: TRL parses tool calls only for
templates it recognises by exact string match, and this one is prefix-preserving with
``<|im_end|>`` as both end of turn and eos (the benchmark checks that the installed TRL still ships it).
"""

from __future__ import annotations

import random
from typing import Any

#: TRL 1.16's ``trl/chat_templates/qwen2_5.jinja``, verbatim (the benchmark checks it still matches).
QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

#: The secret is drawn from 1..MAX_SECRET.
MAX_SECRET = 8
USER_PROMPT = f"Find the secret number from 1 to {MAX_SECRET}. Use the tools."
#: Tool calls the scripted teacher makes at most (the benchmark's tool-calling limit).
MAX_TOOL_CALLS = 4


class GuessNumber:
    """Find a secret number with at most a few tool calls; reward 1 when a guess was right.

    The tools are defined in name order and carry no return annotation, so that TRL (transformers'
    ``get_json_schema``, tools sorted by name) and rollforge (``discover_tools``, definition order)
    render the same tool list into the prompt, token for token."""

    def reset(self, **row: Any) -> str | None:
        self.secret = int(row["secret"])
        self.solved = False
        return None

    def guess(self, number: int):
        """Guess the secret number: the answer is correct, higher (the secret is larger) or lower.

        Args:
            number: The guess, a whole number from 1 to 8.
        """
        if number == self.secret:
            self.solved = True
            return "correct"
        return "higher" if number < self.secret else "lower"

    def hint(self, kind: str):
        """Get a hint about the secret number.

        Args:
            kind: "parity" (the answer is even or odd) or "size" (small for 1 to 4, large for 5 to 8).
        """
        if kind == "parity":
            return "even" if self.secret % 2 == 0 else "odd"
        if kind == "size":
            return "small" if self.secret <= MAX_SECRET // 2 else "large"
        raise ValueError(f"kind must be 'parity' or 'size', got {kind!r}")

    def get_reward(self) -> float:
        return 1.0 if self.solved else 0.0


def prompt_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows ``{prompt, secret}`` (the same question; the secret cycles through 1..MAX_SECRET)."""
    secrets = [1 + i % MAX_SECRET for i in range(n)]
    random.Random(seed).shuffle(secrets)
    return [{"prompt": [{"role": "user", "content": USER_PROMPT}], "secret": s} for s in secrets]


def scripted_episode(rng: random.Random) -> list[dict[str, Any]]:
    """One teacher conversation: maybe a hint (parity or size), then guesses consistent with the feedback (usually the
    middle candidate, sometimes a random one), then a short answer without a tool call."""
    secret = rng.randint(1, MAX_SECRET)
    env = GuessNumber()
    env.reset(secret=secret)
    messages: list[dict[str, Any]] = [{"role": "user", "content": USER_PROMPT}]
    candidates = list(range(1, MAX_SECRET + 1))
    calls = 0

    def call(name: str, arguments: dict[str, Any]) -> str:
        tool_call = {"type": "function", "function": {"name": name, "arguments": arguments}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call]})
        result = getattr(env, name)(**arguments)
        messages.append({"role": "tool", "name": name, "content": result})
        return result

    kind = rng.choice(["parity", "size", None])
    if kind is not None:
        answer = call("hint", {"kind": kind})
        calls += 1
        if kind == "parity":
            candidates = [c for c in candidates if (c % 2 == 0) == (answer == "even")]
        else:
            candidates = [c for c in candidates if (c <= MAX_SECRET // 2) == (answer == "small")]
    while calls < MAX_TOOL_CALLS and not env.solved:
        number = candidates[len(candidates) // 2] if rng.random() < 0.7 else rng.choice(candidates)
        feedback = call("guess", {"number": number})
        calls += 1
        candidates = [c for c in candidates if c != number and (c > number) == (feedback == "higher")]
    answer = f"The secret number is {secret}." if env.solved else "I could not find it."
    messages.append({"role": "assistant", "content": answer})
    return messages


def tool_methods() -> list[Any]:
    """The tools as TRL sees them (bound methods; transformers derives their JSON schemas)."""
    env = GuessNumber()
    return [env.guess, env.hint]  # TRL lists them in name order (inspect.getmembers)


def render(messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
    """A conversation offering the two tools, rendered by the Qwen2.5 template as TRL renders it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        [messages], tools=tool_methods(), chat_template=QWEN25_TEMPLATE, add_generation_prompt=add_generation_prompt
    )
    return rendered[0]
