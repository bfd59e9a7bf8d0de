"""An agent for `--rollout.agent-cmd`: standard-library Python over raw HTTP, the way an agent in any language
talks to the endpoint. It runs its own calculator and leaves the grading to the env (it prints no reward line).

    torchrun --nproc_per_node 2 run.py --preset tool_use --rollout.agent-cmd "python examples/http_agent.py"

It reads the episode from the environment: OPENAI_BASE_URL, OPENAI_API_KEY and NANOSKY_TASK (a JSON file with
messages, tools, id and seed).
"""

import ast
import json
import operator
import os
import urllib.request

OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
}


def calculate(expression: str) -> str:
    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.operand))
        raise ValueError("only integer arithmetic")

    try:
        return str(ev(ast.parse(expression, mode="eval").body))
    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError) as e:
        return f"Error: {e}"


def chat(messages: list[dict], tools: list[dict]) -> dict:
    body = json.dumps({"model": "policy", "messages": messages, "tools": tools}).encode()
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=body,
        headers={
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)["choices"][0]["message"]


def main() -> None:
    task = json.load(open(os.environ["NANOSKY_TASK"]))
    messages, tools = list(task["messages"]), task["tools"]
    for _ in range(4):
        reply = chat(messages, tools)
        messages.append(reply)
        if not reply.get("tool_calls"):
            return  # the final answer: the env grades it
        for call in reply["tool_calls"]:
            f = call["function"]
            try:
                args = json.loads(f["arguments"])
            except json.JSONDecodeError:
                args = {}
            out = calculate(str(args.get("expression", ""))) if f["name"] == "calculator" else "Error: no such tool"
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})


if __name__ == "__main__":
    main()
