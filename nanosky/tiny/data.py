"""The bundled tiny models' training data (`nanosky.tiny` builds the models): text_math answers in three styles,
tool_use expert conversations, webshop_lite / alfworld_lite expert episodes (whole, or one example per turn as
`--rollout.mode stepwise` renders it), and copy drills. Everything is generated from the train splits and a seed.

An example is `(messages, tool schemas)`, or `(messages, None, "last")` when only its last turn is trained.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import torch

from nanosky.tiny.drills import copy_drill
from nanosky.tiny.swe_data import swe_conversations

if TYPE_CHECKING:
    from nanosky.tiny.config import TinyConfig

STYLES = {"think": 0.3, "direct": 0.3, "plain": 0.4}


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
    from nanosky.agent.window import window

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
                "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))).capitalize()
                for _ in range(rng.randint(1, 3))
            )
        out.append(copy_drill(text))
    return out


def conversations(
    n_math: int,
    n_tool: int,
    seed: int,
    n_agent: int = 0,
    n_copy: int = 0,
    cfg: TinyConfig | None = None,
    stage: int = 1,
) -> tuple[list, random.Random]:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    convs = [(_math_example(rng), None) for _ in range(n_math)] + _tool_examples(n_tool, seed)
    convs += _agent_examples(n_agent, seed) + _copy_examples(n_copy, seed)
    if cfg is not None:  # the step-wise agent data
        n_steps, n_act = (cfg.n_steps, cfg.n_action_copy) if stage == 1 else (cfg.n_steps2, cfg.n_action_copy2)
        convs += _step_examples(n_steps, seed, cfg.step_noise, cfg.history_window)
        convs += [copy_drill(text) for text in _action_copy_texts(n_act, seed)]
        if stage == 1:
            convs += swe_conversations(cfg, seed)
    rng.shuffle(convs)
    return convs, rng
