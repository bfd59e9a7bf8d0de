"""The SWE agent env lives in `envs/swe/env.py` (training and evaluation share it, with the shared `bash` and
`str_replace_editor` tools); this module keeps its old import path."""

from envs.swe.env import NUDGE, SYSTEM_PROMPT, SubmitTool, SWEEnv, clip

__all__ = ["NUDGE", "SYSTEM_PROMPT", "SWEEnv", "SubmitTool", "clip"]
