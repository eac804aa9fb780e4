"""A finqa-lite agent written only against the `openai` client: its own prompt, worked examples and tool loop.

agentrft runs it once per episode (`agent.command` in train.yaml, or `agentrft eval --agent-command`):
the task arrives as JSON on stdin, OPENAI_BASE_URL / OPENAI_API_KEY point at a session of the policy
being trained, and what this prints on stdout is the final answer that gets graded. Nothing here
imports agentrft; point OPENAI_BASE_URL at any OpenAI-compatible endpoint and it runs the same.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import sys

from openai import OpenAI

SYSTEM = """You answer questions about companies' annual reports. Amounts are in millions of dollars.
Use the tools to find figures and to compute. When you know the answer, reply without a tool call: "The answer is <number>."
Give ratios and percentage changes as decimals (0.0164, not 1.64%)."""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": 'Evaluate arithmetic like "(5829 - 5735) / 5735".',
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "the arithmetic expression."}},
                "required": ["expression"],
            },
        },
    }
]

# Worked examples (a fictional company): a small model copies the shape of a call far better than it follows prose.
_WORKED = [
    (
        "For Larch Energy Corp.: revenue was $13,423 million in 2022; revenue was $12,820 million in 2021. "
        "What was the percentage change in Larch Energy Corp.'s revenue from 2021 to 2022?",
        "(13423 - 12820) / 12820",
        "0.04704",
    ),
    (
        "For Larch Energy Corp.: gross profit was $6,950 million in 2022; revenue was $13,423 million in 2022. "
        "What was the gross margin (gross profit / revenue) of Larch Energy Corp. in 2022?",
        "6950 / 13423",
        "0.51777",
    ),
    (
        "For Larch Energy Corp.: net income was $3,193 million in 2022; net income was $3,375 million in 2021. "
        "What was the change in Larch Energy Corp.'s net income from 2021 to 2022 (in millions)?",
        "3193 - 3375",
        "-182",
    ),
]

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        if isinstance(node.op, ast.Pow) and abs(_eval(node.right)) > 100:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError("only numbers, + - * / ** and parentheses are allowed")


def calculate(expression: str) -> str:
    """The calculator tool, run here: compact text of the result, or an error the model can read."""
    try:
        value = _eval(ast.parse(expression.replace(",", "").replace("%", "/100"), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError) as exc:
        return f"Error: cannot evaluate {expression!r}: {exc}"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text if text not in ("0", "-0") else f"{value:.6g}"


def worked_examples() -> list[dict]:
    messages: list[dict] = []
    for i, (question, expression, answer) in enumerate(_WORKED):
        call_id = f"example_{i}"
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": "calculate", "arguments": json.dumps({"expression": expression})},
        }
        messages += [
            {"role": "user", "content": question},
            {"role": "assistant", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": calculate(expression)},
            {"role": "assistant", "content": f"The answer is {answer}."},
        ]
    return messages


def run(question: str, client: OpenAI, max_turns: int = 3) -> str:
    """The tool loop: call the model; run the calls it makes; its first reply without a call is the answer."""
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        *worked_examples(),
        {"role": "user", "content": question},
    ]
    text = ""
    for _ in range(max_turns):
        reply = client.chat.completions.create(
            model=os.environ.get("AGENT_MODEL", "agentrft"),
            messages=messages,
            tools=TOOLS,
            max_tokens=128,
            temperature=0.7,
        )
        message = reply.choices[0].message
        text = message.content or ""
        if not message.tool_calls:
            return text
        messages.append(message.model_dump(exclude_none=True))  # the reply sent back exactly as received
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = call.function.arguments
            result = (
                calculate(str(expression))
                if call.function.name == "calculate"
                else f"Error: no tool {call.function.name}"
            )
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return text


def main() -> None:
    task = json.load(sys.stdin)
    print(run(task["question"], OpenAI()))


if __name__ == "__main__":
    main()
