# agent_openai.py -- an OpenAI-SDK agent with its own tool loop, unchanged but for its base URL.
# Needs the gateway extra and the OpenAI SDK: pip install 'rollforge[gateway]' openai
# (the agents extra installs the SDK too). Train it with
#   environments: [{name: "examples/agent_openai.py:agent", task_name: agent}]
# or run this file: it plays three questions with smollm2-135m (or the model named on the command line).
import json
import sys

import openai

from rollforge.gateway import AgentEnvironment

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def run_tool(call) -> str:
    """The agent's own tool runner: the result of one tool call, or what was wrong with it, as text."""
    try:
        arguments = json.loads(call.function.arguments)
        if call.function.name == "add":
            return str(int(arguments["a"]) + int(arguments["b"]))
        return f"unknown tool {call.function.name!r}"
    except (ValueError, KeyError, TypeError) as exc:
        return f"bad arguments: {exc}"


async def solve(base_url, row):  # row: the dataset row, with its "prompt"
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = list(row["prompt"])
    while True:
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump())
        if not message.tool_calls:
            return 1.0 if str(row["answer"]) in (message.content or "") else 0.0  # the reward (None: reward functions)
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call)})


agent = AgentEnvironment(solve)  # or AgentEnvironment(cmd=["python", "my_agent.py"]): OPENAI_BASE_URL is set,
#                                  the row comes on stdin, the last stdout line (a number) is the reward

if __name__ == "__main__":
    import rollforge

    model, tokenizer = rollforge.load_model(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m")
    questions = [(2, 3), (17, 25), (40, 2)]
    samples = [
        rollforge.Sample(
            prompt=[{"role": "user", "content": f"What is {a} + {b}? Use the add tool."}],
            task_name="agent",
            row={"answer": a + b},
        )
        for a, b in questions
    ]
    result = rollforge.rollout(
        samples,
        {"agent": agent},
        rollforge.HFBackend(model, tokenizer),
        rollforge.ChatRenderer(tokenizer),
        rollforge.RolloutConfig(max_turns=4, max_new_tokens=48),
    )
    for trajectory in result.trajectories:
        print(trajectory.total_reward, trajectory.turns, len(trajectory.token_ids), sum(trajectory.loss_mask))
