"""`--rollout.agent-cmd "CMD"`: an agent in any language, run once per episode as a shell command.

Its environment holds `OPENAI_BASE_URL` and `OPENAI_API_KEY` (the episode's endpoint and key: every OpenAI SDK
reads them) and `NANOSKY_TASK`, the path of a JSON file with the task's `messages`, `tools`, `id` and `seed`. Its
reward is its last stdout line when that is `{"reward": x}`; otherwise the env grades the last assistant message.
A non-zero exit fails the episode (the last lines of its stderr say why). A command that runs past its time is
killed with its whole process group.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile

STDERR_TAIL = 2000
"""Characters of a failed command's stderr kept in the episode's error."""


class CommandError(RuntimeError):
    """The agent command exited non-zero."""


async def run_command(cmd: str, base_url: str, key: str, task) -> float | None:
    with tempfile.TemporaryDirectory(prefix="nanosky-task-") as d:
        path = os.path.join(d, "task.json")
        with open(path, "w") as f:
            json.dump({"messages": task.messages, "tools": task.tools, "id": task.id, "seed": task.seed}, f)
        env = os.environ | {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key, "NANOSKY_TASK": path}
        proc = await asyncio.create_subprocess_shell(
            cmd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = await proc.communicate()
        except BaseException:  # a timeout (cancelled) or a stop: the command and its children go too
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
            raise
    if proc.returncode:
        tail = err.decode(errors="replace")[-STDERR_TAIL:].strip()
        raise CommandError(f"{cmd!r} exited with status {proc.returncode}" + (f": {tail}" if tail else ""))
    return reward_line(out.decode(errors="replace"))


def reward_line(stdout: str) -> float | None:
    """The reward in the last non-empty stdout line, `{"reward": x}`; None when there is none."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        obj = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    r = obj.get("reward") if isinstance(obj, dict) else None
    return float(r) if isinstance(r, int | float) and not isinstance(r, bool) else None
