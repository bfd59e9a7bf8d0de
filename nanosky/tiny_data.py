"""The bundled tiny models' training data (`nanosky.tiny` builds the models): text_math answers in three styles,
tool_use expert conversations, webshop_lite / alfworld_lite expert episodes (whole, or one example per turn as
`--rollout.mode stepwise` renders it), and copy drills. Everything is generated from the train splits and a seed.

An example is `(messages, tool schemas)`, or `(messages, None, "last")` when only its last turn is trained.
"""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from nanosky.tiny import TinyConfig

STYLES = {"think": 0.3, "direct": 0.3, "plain": 0.4}
COPY_PROMPT = "Repeat the text exactly."


def _math_example(rng: random.Random) -> list[dict]:
    from envs.text_math import SYSTEM_PROMPT, sample_problem

    p = sample_problem(rng)
    style = rng.choices(list(STYLES), weights=list(STYLES.values()))[0]
    if style == "think":
        reply = "\n".join(p.steps) + f"\n<answer>{p.answer}</answer>"
    elif style == "direct":
        reply = f"<answer>{p.answer}</answer>"
    else:
        reply = f"The answer is {p.answer}."
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": p.question},
        {"role": "assistant", "content": reply},
    ]


def _tool_examples(n: int, seed: int) -> list[tuple[list[dict], list[dict]]]:
    """(conversation, tool schemas) from the tool_use env's scripted expert; empty if that env is unavailable."""
    if n <= 0:
        return []
    try:
        import envs
    except ImportError:
        return []
    out = []
    for i in range(n):
        env = envs.make("tool_use", split="train", seed=seed * 1_000_003 + i)
        out.append((env.expert_conversation(), [t.schema for t in env.tools]))
    return out


def _agent_examples(n: int, seed: int) -> list[tuple[list[dict], None]]:
    """Expert episodes of the text-game envs (webshop_lite with 3 results per page, as its preset runs it)."""
    if n <= 0:
        return []
    import envs
    from envs.base import expert_episode

    out = []
    for i in range(n):
        name, kw = [("webshop_lite", {"page_size": 3}), ("alfworld_lite", {})][i % 2]
        out.append((expert_episode(envs.make(name, split="train", seed=seed * 1_000_003 + i, **kw)), None))
    return out


def _step_examples(n: int, seed: int, noise: float, k: int) -> list[tuple[list[dict], None, str]]:
    """One example per turn of `n` episodes of a noisy expert (see TinyConfig.step_noise), rendered step-wise."""
    if n <= 0:
        return []
    import envs
    from nanosky.stepwise import window

    rng, out = random.Random(seed + 31), []
    for i in range(n):
        name, kw = [("webshop_lite", {"page_size": 3}), ("alfworld_lite", {})][i % 2]
        env = envs.make(name, split="train", seed=seed * 1_000_003 + 700_000 + i, show_actions=True, **kw)
        messages = env.reset()
        while not env.done:
            acts = env.available_actions()
            action = rng.choice(acts) if acts and rng.random() < noise else env.expert_action()
            out.append((window(messages, k) + [{"role": "assistant", "content": action}], None, "last"))
            messages += [{"role": "assistant", "content": action}, *env.step(action).observations]
    return out


def _action_copy_texts(n: int, seed: int) -> list[str]:
    """Admissible actions (alfworld: go to / take / put …; webshop: click[...] on ids and options, search[...] on
    instructions) to copy, drawn from random states of train-split episodes."""
    import envs

    rng, out = random.Random(seed + 53), []
    while len(out) < n:
        name, kw = [("webshop_lite", {"page_size": 3}), ("alfworld_lite", {})][len(out) % 2]
        env = envs.make(name, split="train", seed=seed * 1_000_003 + 900_000 + len(out), **kw)
        env.reset()
        for _ in range(rng.randint(0, 6)):
            if env.done or not env.available_actions():
                break
            env.step(env.expert_action() if rng.random() < 0.7 else rng.choice(env.available_actions()))
        acts = env.available_actions() or [env.expert_action()]
        out.append(" | ".join(rng.sample(acts, min(len(acts), rng.randint(1, 3)))))
    return out


def _swe_examples(
    n: int, seed: int, levels: tuple[int, ...] = (1, 1, 2)
) -> list[tuple[list[dict], list[dict]]]:
    """Whole expert episodes of `envs.make("swe")` (train split; level by index from `levels`), tools run for real
    in the sandbox (grading skipped: the expert resolves every instance), with the tools' schemas."""
    if n <= 0:
        return []
    import envs
    from envs.base import expert_episode

    out = []
    for i in range(n):
        env = envs.make(
            "swe", split="train", seed=seed * 1_000_003 + 300_000 + i, level=levels[i % len(levels)]
        )
        env.grade = False
        out.append((expert_episode(env), [t.schema for t in env.tools]))
    return out


def _swe_fix_turns(
    n: int, seed: int, levels: tuple[int, ...] = (1, 1, 2)
) -> list[tuple[list[dict], list[dict]]]:
    """The first turns of expert episodes, cheaply: (grep,) view, then the str_replace that fixes the bug. The view
    is the real editor's output on the task's files in a scratch dir, and the grep line is what `grep -rn` prints,
    so these are the same turns `_swe_examples` records, without the sandbox (no test run, no submit)."""
    if n <= 0:
        return []
    import os
    import tempfile

    from envs.swe import OBS_CHARS, generate
    from envs.swe.build import unified_diff
    from envs.swe.env import SYSTEM_PROMPT, SubmitTool, expert_plan
    from envs.tools import BashTool, StrReplaceEditor

    schemas = [t.schema for t in (BashTool(), StrReplaceEditor(), SubmitTool())]
    out = []
    for i in range(n):
        task = generate(seed * 1_000_003 + 600_000 + i, levels[i % len(levels)])
        with tempfile.TemporaryDirectory(prefix="nanosky-tiny-swe-") as root:
            for path, text in task.files.items():
                os.makedirs(os.path.dirname(os.path.join(root, path)) or root, exist_ok=True)
                with open(os.path.join(root, path), "w") as f:
                    f.write(text)
            ed = StrReplaceEditor(root=root, max_output_chars=OBS_CHARS, protected=(".git",))
            inst = {"patch": unified_diff(task.files, task.fixed_files), "level": task.level, "bug": task.bug}
            plan = expert_plan(inst, task.files.get)[:-2]  # without the test run and submit
            msgs = [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": task.problem_statement.strip()},
            ]
            for action in plan:
                call = json.loads(action.removeprefix("<tool_call>").removesuffix("</tool_call>"))
                if call["name"] == "bash":  # grep -rn 'def f(' --include=*.py . : one definition, one line
                    src = task.files[task.bug["path"]].split("\n")
                    k = next(j for j, ln in enumerate(src) if ln.startswith(f"def {task.bug['function']}("))
                    obs = f"./{task.bug['path']}:{k + 1}:{src[k]}"
                else:
                    try:
                        obs = ed(**call["arguments"])
                    except ValueError as e:
                        obs = f"Error: str_replace_editor failed: ValueError: {e}"
                msgs += [
                    {"role": "assistant", "content": action},
                    {"role": "tool", "name": call["name"], "content": obs},
                ]
            out.append((msgs[:-1], schemas))
    return out


def _code_copy_examples(n: int, seed: int) -> list[tuple[list[dict], None]]:
    """Copy drills for the editor: lines of a generated package's source as `str_replace_editor view` shows them
    (numbered), to be written back as the JSON string an old_str is (one to four lines, indentation kept)."""
    if n <= 0:
        return []
    from envs.swe import generate

    rng, out = random.Random(seed + 91), []
    while len(out) < n:
        task = generate(seed * 1_000_003 + 400_000 + len(out), rng.choice((1, 2)))
        lines = task.files[task.bug["path"]].splitlines()
        k = rng.choice((1, 1, 2, 3, 4))
        i = rng.randrange(max(1, len(lines) - k))
        shown = "\n".join(f"{j + 1:6d}\t{lines[j]}" for j in range(i, min(len(lines), i + k)))
        out.append(_copy_drill(shown, json.dumps("\n".join(lines[i : i + k]))))
    return out


def _copy_drill(text: str, answer: str | None = None) -> tuple[list[dict], None]:
    return (
        [
            {"role": "system", "content": COPY_PROMPT},
            {"role": "user", "content": text},
            {"role": "assistant", "content": text if answer is None else answer},
        ],
        None,
    )


def _copy_examples(n: int, seed: int) -> list[tuple[list[dict], None]]:
    """Copy drills: tool use is mostly copying (the question's numbers into the call, the tool's output into the
    answer), and in a mixed corpus the base model never learned to copy; dense copy targets teach it fast. Sources
    are train-split tool_use questions, arguments and answers, digit strings and made-up words."""
    if n <= 0:
        return []
    from envs.tool_use import train_task

    rng = random.Random(seed + 77)
    out = []
    for i in range(n):
        task = train_task(seed * 1_000_003 + 500_000 + i)
        pick = rng.randrange(5)
        if pick == 0:
            text = task.question
        elif pick == 1:
            text = " ".join(str(v) for _, args in task.calls for v in args.values())
        elif pick == 2:
            text = task.answer
        elif pick == 3:
            text = "".join(rng.choice("0123456789") for _ in range(rng.randint(3, 14)))
        else:
            text = " ".join(
                "".join(
                    rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))
                ).capitalize()
                for _ in range(rng.randint(1, 3))
            )
        out.append(_copy_drill(text))
    return out


def conversations(
    n_math: int, n_tool: int, seed: int, n_agent: int = 0, n_copy: int = 0, cfg: TinyConfig | None = None,
    stage: int = 1,
) -> tuple[list, random.Random]:  # fmt: skip
    rng = random.Random(seed)
    torch.manual_seed(seed)
    convs = [(_math_example(rng), None) for _ in range(n_math)] + _tool_examples(n_tool, seed)
    convs += _agent_examples(n_agent, seed) + _copy_examples(n_copy, seed)
    if cfg is not None:  # the step-wise agent data
        n_steps, n_act = (
            (cfg.n_steps, cfg.n_action_copy) if stage == 1 else (cfg.n_steps2, cfg.n_action_copy2)
        )
        convs += _step_examples(n_steps, seed, cfg.step_noise, cfg.history_window)
        convs += [_copy_drill(text) for text in _action_copy_texts(n_act, seed)]
        n_swe, n_code, n_fix = (cfg.n_swe, cfg.n_code_copy, cfg.n_swe_fix) if stage == 1 else (0, 0, 0)
        convs += _swe_examples(n_swe, seed) + _code_copy_examples(n_code, seed) + _swe_fix_turns(n_fix, seed)
    rng.shuffle(convs)
    return convs, rng
