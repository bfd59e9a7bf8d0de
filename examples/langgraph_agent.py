"""A LangGraph ReAct agent for `--rollout.agent-cmd`, run as a user would run one: in a venv of its own (LangGraph
is not a nanosky dependency), streaming its model calls, with its own calculator tool. It leaves the grading to
the env (it prints no reward line), so the env grades the agent's last reply.

    python -m venv .venv-lg && .venv-lg/bin/pip install langgraph langchain-openai
    torchrun --nproc_per_node 2 run.py --preset tool_use \\
        --rollout.agent-cmd ".venv-lg/bin/python examples/langgraph_agent.py" --rollout.agent-concurrency 16

Each episode is one process (about 100 MB: LangChain and LangGraph imported), so `--rollout.agent-concurrency`
bounds how many live at once per rank. ChatOpenAI reads OPENAI_BASE_URL and OPENAI_API_KEY, which nanosky sets to
the episode's endpoint and key; NANOSKY_TASK is the episode (messages, tools, id, seed).
"""

import json
import os

# the standard-library calculator of examples/http_agent.py, beside this file (the script's folder is on sys.path)
from http_agent import calculate
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

MAX_TURNS = 4  # the tool_use env's own limit


@tool
def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression exactly, e.g. "17*23 + 4"."""
    return calculate(expression)


def main() -> None:
    task = json.load(open(os.environ["NANOSKY_TASK"]))
    roles = {"system": SystemMessage, "user": HumanMessage}
    messages = [roles[m["role"]](content=m["content"]) for m in task["messages"] if m["role"] in roles]
    model = ChatOpenAI(model="policy", streaming=True, max_retries=2, timeout=300)  # server-sent events
    agent = create_react_agent(model, [calculator])
    try:
        agent.invoke({"messages": messages}, {"recursion_limit": 2 * MAX_TURNS + 1})
    except Exception as e:  # noqa: BLE001 - GraphRecursionError: out of turns; the env grades the last reply
        if type(e).__name__ != "GraphRecursionError":
            raise


if __name__ == "__main__":
    main()
