"""An external agent's episode as the trainer's `Trajectory`.

One segment (every call continued the last, append-only) is one concatenated row, exactly as nanosky's own loop
builds it: `ids`, `loss_mask`, `logprobs` are the segment's, each call a turn (GiGPO: each call is a step, keyed by
the messages it answered). Every segment is also kept as a `Step` (its prompt, then its sampled and observation
ids with their mask), so that an episode of several segments (an edited history, a template that rewrites earlier
turns) trains as step-wise rows: the trainer takes the step-wise path for a batch where any episode has more than
one segment (`trainer.prepare`), and every episode's segments are then its rows, each with its episode's
advantage (GiGPO: each segment a step, keyed by its first call). `ids` keeps the last segment, for the logs.
"""

from __future__ import annotations

from nanosky.agent.trajectory import Step, Trajectory


def to_trajectory(t: Trajectory, slot, task, tok) -> Trajectory:
    """Fill `t` from the endpoint's `slot` (None: the episode never opened) and its `AgentTask` (None: the env
    never came up)."""
    segs = slot.episode.segments if slot is not None else []
    if task is not None and task.done:  # the env's verdict (None: an env without a checker)
        t.success = task.success
    else:
        t.success = t.reward > 0 and t.stop_reason == "done"
    if not segs:  # no call was answered: the opening prompt alone, nothing to train
        if task is not None:
            from nanosky.rollout.chat import prompt_ids

            t.messages = list(task.messages)
            t.ids = prompt_ids(tok, task.messages, task.tools or None)
        t.loss_mask, t.logprobs, t.prompt_len = [0] * len(t.ids), [0.0] * len(t.ids), len(t.ids)
    else:
        last = segs[-1]
        t.ids, t.loss_mask, t.logprobs = list(last.ids), list(last.loss_mask), list(last.logprobs)
        t.prompt_len, t.messages = last.prompt_len, list(last.messages)
        t.versions = list(last.token_versions)  # which weights sampled each id (a carried episode's span several)
        t.steps = [
            Step(
                s.ids[: s.prompt_len],
                s.ids[s.prompt_len :],
                s.logprobs[s.prompt_len :],
                loss_mask=s.loss_mask[s.prompt_len :],
                versions=s.token_versions[s.prompt_len :],
            )
            for s in segs
        ]
    calls = sum(s.calls for s in segs)
    t.turns = calls
    keys = slot.keys if slot is not None else []
    # state keys per step: per call in one segment, per segment (its first call's) in several
    if len(segs) > 1:
        firsts = [sum(s.calls for s in segs[:k]) for k in range(len(segs))]
        t.state_keys = [keys[f] for f in firsts]
    else:
        t.state_keys = list(keys)
    t.completion_tokens = sum(sum(s.loss_mask) for s in segs)
    t.prompt_tokens = sum(ts for s in segs for ts in s.turn_starts)  # what each call's prompt held
    t.tool_calls = sum(len(m.get("tool_calls") or []) for s in segs for m in s.messages if m.get("role") == "assistant")
    if task is not None:
        t.info |= {k: v for k, v in task.info.items() if k != "calls"} | {"env_steps": task.steps}
    if slot is not None:
        t.info["agent"] = {
            "segments": len(segs),
            "calls": calls,
            "rejected": slot.errors,
            "asked": slot.asked[:8],
            "versions": [v for s in segs for v in s.versions],
        }
    return t


def mask_failed(trajs: list[Trajectory], failed: tuple[str, ...]) -> list[Trajectory]:
    """Episodes whose agent failed train no token, and take their group's mean reward (over the group's episodes
    that did not fail; 0 if none did), so that they move neither the group's baseline nor anyone's advantage."""
    groups: dict[int, list[float]] = {}
    for t in trajs:
        if t.stop_reason not in failed:
            groups.setdefault(t.group, []).append(t.reward)
    for t in trajs:
        if t.stop_reason in failed:
            ok = groups.get(t.group, [])
            t.reward, t.success = (sum(ok) / len(ok) if ok else 0.0), False
            t.mask_out()
    return trajs
