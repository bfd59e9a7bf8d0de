"""The benchmark shapes nanosky's and TRL's step-time scripts share.

- `math` (today's): text_math, a ~51-token prompt, 8 samples × ≤ 32 new tokens.
- `agent`: the same problems behind an agent's system prompt, the tool_use tools' JSON schemas (~370 prompt
  tokens), 8 samples × ≤ 32 new tokens. Prompt-heavy, like the agent workloads this library is for: a group's 8
  samples share ~92 % of their tokens.
"""

import json

from envs import text_math
from envs.tools.base import get_tool

TOOLS = ("calculator", "python_exec", "search", "wiki")
AGENT_SYSTEM = (
    text_math.SYSTEM_PROMPT
    + "\n\n# Tools\nYou may call one of these functions per turn as <tool_call>{...}</tool_call>:\n<tools>\n"
    + "\n".join(json.dumps(get_tool(n).schema) for n in TOOLS)
    + "\n</tools>"
)
SYSTEM = {"math": text_math.SYSTEM_PROMPT, "agent": AGENT_SYSTEM}
# prompt + 32 new tokens, with room: the bundled model's context is 512
MAX_TOTAL = {"math": 160, "agent": 480}
