"""Partial rollouts at 2 ranks through torchrun (nanosky/partial.py): K = 0 is the synchronous step exactly;
tool_use and swe with K = 1, F = 1.5 carry episodes across steps within the staleness bound, corrected (TIS), with
checkpoint steps that drain, and swe's kill -9 -> resume continues the run exactly; an external agent's episode
spans a weight update. In every run the trainer-vs-engine gap on the tokens sampled at the trainer's own version
(`train/mismatch/fresh_*`) stays within the probe's bound: carried tokens (`stale_*`) do not hide a broken sync."""

import json
import math
import os
import signal

from spawn import launch, scalars, torchrun, wait_for_beat

from nanosky.seeds import derive_seed

SMOKE = ["--preset", "smoke", "--precision", "fp32", "--steps", "3", "--log.ckpt-every", "0", "--eval.limit", "4"]
TOOL = ["--preset", "tool_use", "--steps", "4", "--rollout.prompts-per-step", "8", "--rollout.group-size", "4"]
TOOL += ["--eval.every", "0", "--eval.limit", "4", "--eval.n-samples", "1", "--log.ckpt-every", "2"]
TOOL += ["--rollout.max-staleness", "1", "--rollout.oversample", "1.5", "--log.samples-per-step", "100"]
TOOL += [
    "--optim.no-skip-zero-adv",
    "--engine.kv-cache-gib",
    "0.25",
]  # every row scored: the correction's weights are measured at every step
WORLD, SHARE, TARGET = 2, 4, 6  # 8 prompts a step over 2 ranks; ceil(1.5 x 4) groups in flight per rank
PARTIAL = ["--rollout.max-staleness", "1", "--rollout.oversample", "1.5", "--log.samples-per-step", "100"]
# which episodes a phase's end cuts is timing; held, the groups started beyond a phase's share send their first
# requests and hold the rest until that phase ends: every such phase carries them, on any machine (partial.Hold)
HOLD = ["--debug.hold-extra-groups"]
SWE = ["--preset", "swe", "--steps", "4", "--rollout.prompts-per-step", "4", "--rollout.group-size", "2"]
SWE += ["--eval.every", "0", "--eval.limit", "2", "--envpool.workers", "1", "--env-kwargs.max-turns", "3"]
SWE += [
    "--engine.kv-cache-gib",
    "0.25",
    "--log.ckpt-every",
    "2",
    "--precision",
    "fp32",
    "--rollout.max-new-tokens",
    "64",
    *PARTIAL,
    *HOLD,
]


def _records(run_dir) -> list[dict]:
    return [json.loads(x) for x in open(os.path.join(run_dir, "rollouts.jsonl"))]


def _fresh_within_the_probe(s: dict, every_step: bool = True) -> None:
    """On the tokens sampled at the trainer's own version the gap to the engine is numerics alone (the sync held):
    its mean is within the probe's bound (`rollout/probe_tol`, the tolerance the sync check holds the probe to).
    `every_step`: each step trained such tokens (else a step whose rows were all skipped for a zero advantage
    measured none: NaN)."""
    [(_, tol)] = s["rollout/probe_tol"]
    fresh = s["train/mismatch/fresh_abs_mean"]
    assert fresh and all(v < tol or (not every_step and math.isnan(v)) for _, v in fresh), (fresh, tol)


def test_staleness_0_is_the_synchronous_step_exactly(tmp_path):
    """`--rollout.max-staleness 0 --rollout.oversample 1` takes the synchronous path: the same samples (each step's
    groups seeded as the synchronous step seeds them), losses and weights as a run without the flags. Through the
    carry instead, the groups would be seeded by its own rule and differ."""
    a, b = str(tmp_path / "default"), str(tmp_path / "k0")
    for run_dir, extra in ((a, []), (b, ["--rollout.max-staleness", "0", "--rollout.oversample", "1"])):
        r = torchrun([*SMOKE, "--log.run-dir", run_dir, "--log.samples-per-step", "100", *extra])
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    sa, sb = scalars(a), scalars(b)
    for tag in ("train/pg_loss", "train/grad_norm", "train/reward_mean", "rollout/logprob_diff_mean"):
        assert sa[tag] == sb[tag], (tag, sa[tag], sb[tag])
    assert "rollout/carried" not in sb
    ra, rb = _records(a), _records(b)
    assert [(x["step"], x["group"], x["env_seed"], x["reward"]) for x in ra] == [
        (x["step"], x["group"], x["env_seed"], x["reward"]) for x in rb
    ]
    # the synchronous step's seeds: prompt j of step s is derive_seed(seed, s, round 0, j), group j
    assert all(x["env_seed"] == derive_seed(0, x["step"], 0, x["group"]) for x in rb if x["split"] == "train")
    # every token of a synchronous step is sampled at the trainer's version: all fresh (the same tokens as the
    # mixed number), none stale, at every step
    mixed, fresh = dict(sb.get("train/mismatch/mismatch_abs_mean", [])), dict(sb["train/mismatch/fresh_abs_mean"])
    assert all(fresh[st] == v for st, v in mixed.items()), (mixed, fresh)
    stale = sb["train/mismatch/stale_abs_mean"]
    assert [st for st, _ in stale] == [1, 2, 3] and all(math.isnan(v) for _, v in stale), stale
    wa = open(os.path.join(a, "checkpoints", "step_000003", "export", "model.safetensors"), "rb").read()
    wb = open(os.path.join(b, "checkpoints", "step_000003", "export", "model.safetensors"), "rb").read()
    assert wa == wb


def test_tool_use_carries_episodes_within_the_bound_and_drains_at_a_checkpoint(tmp_path):
    run_dir = str(tmp_path / "k1")
    r = torchrun([*TOOL, *HOLD, "--log.run-dir", run_dir], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    s = scalars(run_dir)
    carried = dict(s["rollout/carried"])
    assert [st for st, _ in s["rollout/carried"]] == [1, 2, 3, 4]
    assert carried[1] == 0 and carried[3] == 0  # the first step, and the one after the checkpoint (step 2 drained)
    assert carried[2] > 0 and carried[4] > 0, carried  # the held groups' episodes were cut and resumed
    assert all(v <= 1 for _, v in s["rollout/staleness_max"]), s["rollout/staleness_max"]
    assert all(0 < v for _, v in s["train/is_weight_mean"])  # TIS, on by default with K > 0
    assert all(v <= 2.0 for _, v in s["train/is_weight_max"])  # the cap
    _fresh_within_the_probe(s)
    stale = dict(s["train/mismatch/stale_abs_mean"])
    assert math.isnan(stale[1]) and math.isnan(stale[3]), stale  # nothing carried into them: no token is older
    assert any(math.isfinite(stale[st]) for st in (2, 4)), stale  # the held groups' first replies, a version old
    groups = [(x["step"], x["group"]) for x in _records(run_dir) if x["split"] == "train"]
    trained = {}
    for step, g in groups:
        trained.setdefault(g, set()).add(step)
    assert all(len(steps) == 1 for steps in trained.values()), trained  # no group trained at two steps
    assert len(trained) == 4 * 4  # rank 0's share of every step (4 groups), all logged


def _trained(run_dir: str) -> dict[int, list[dict]]:
    """Rank 0's trained episodes by step."""
    out: dict[int, list[dict]] = {}
    for x in _records(run_dir):
        if x["split"] == "train":
            out.setdefault(x["step"], []).append(x)
    return out


def test_swe_carries_within_the_bound_and_a_kill_9_resume_continues_the_run_exactly(tmp_path):
    """swe, K = 1, F = 1.5, a checkpoint every 2 steps. Rank 1 is killed -9 while it trains step 3; the run resumes
    from step 2's checkpoint, which drained: no episode was in flight, so nothing is lost. Step 3 starts the same
    groups with the same seeds from the same weights: a group both runs train at step 3 (never cut: it started and
    ended in that phase) has the same tokens. Which groups finish first is timing, as in any K > 0 run."""
    straight, run = str(tmp_path / "straight"), str(tmp_path / "run")
    r = torchrun([*SWE, "--log.run-dir", straight], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    s = scalars(straight)
    carried = dict(s["rollout/carried"])
    assert carried[1] == 0 and carried[3] == 0 and carried[2] > 0 and carried[4] > 0, carried
    assert all(v <= 1 for _, v in s["rollout/staleness_max"]), s["rollout/staleness_max"]
    _fresh_within_the_probe(s, every_step=False)  # swe skips zero-advantage rows: a step may measure none

    proc = launch([*SWE, "--log.run-dir", run])
    m = wait_for_beat(os.path.join(run, "heartbeat.rank1"), 0, r"rank 1 pid (\d+) step 3 train", proc)
    os.kill(int(m.group(1)), signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    with open(os.path.join(run, "checkpoints", "latest")) as f:
        assert f.read().strip() == "step_000002"
    r = torchrun([*SWE, "--log.run-dir", run, "--resume", "latest"], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    b = scalars(run)
    assert dict(b["rollout/carried"])[3] == 0  # resumed from a drained step: nothing was in flight
    a3, b3 = ({x["group"]: x for x in _trained(d)[3]} for d in (straight, run))
    both = sorted(set(a3) & set(b3))
    # step 3 follows a drained step: it starts 3 groups, holds the one beyond the share, and trains the other 2 in both
    assert both == sorted(a3) == sorted(b3) and len(both) == 2, (sorted(a3), sorted(b3))  # swe: share 2 of 3
    for g in both:
        assert (a3[g]["env_seed"], a3[g]["messages"]) == (b3[g]["env_seed"], b3[g]["messages"]), g
    groups = [x["group"] for xs in _trained(run).values() for x in xs]
    assert len(set(groups)) * 2 == len(groups)  # each group trained once (2 episodes each), over the kill too


def test_an_external_agents_episode_spans_a_weight_update(tmp_path):
    """`--rollout.agent` with K = 1: an agent that thinks between its two calls (two segments) is carried while it
    thinks, and its second call is answered by the next step's weights: the segments record two versions. The evals
    between steps run their own episodes on the same endpoint while the carried ones wait. The groups a phase starts
    beyond its share are held (`--debug.hold-extra-groups`): their second calls wait for the phase's end, so the
    span happens on any machine."""
    run_dir = str(tmp_path / "agent")
    agent = ["--rollout.agent", "tests.scripts.pondering_agent:solve", "--log.ckpt-every", "0", "--steps", "3"]
    agent += ["--eval.every", "1"]  # evals between phases, while carried episodes wait: theirs are not held
    r = torchrun([*TOOL, *agent, *HOLD, "--precision", "fp32", "--log.run-dir", run_dir], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    s = scalars(run_dir)
    assert sum(v for _, v in s["rollout/carried"]) > 0
    assert all(v == 0 for tag in ("agent/errors", "agent/timeouts") for _, v in s[tag])
    assert all(v <= 1 for _, v in s["rollout/staleness_max"])
    assert [st for st, _ in s["eval/accuracy"]] == [0, 1, 2, 3]
    _fresh_within_the_probe(s)  # each segment's row carries the versions of its ids (nanosky/train/stepwise.py)
    trained = _trained(run_dir)
    spans = [x for step, xs in trained.items() for x in xs if x["info"]["agent"]["versions"] == [step - 2, step - 1]]
    assert spans and all(x["info"]["agent"]["segments"] == 2 for x in spans)
    # rank 0's held groups of step 1 (group ids (step x world + rank) x target + k, k >= share: partial.py): carried,
    # then trained first at step 2, each episode over versions 0 and 1
    waited = {derive_seed(0, 1, "group", WORLD * TARGET + k) for k in range(SHARE, TARGET)}
    at2 = [x for x in trained[2] if x["env_seed"] in waited]
    assert len(at2) == 2 * 4 and all(x["info"]["agent"]["versions"] == [0, 1] for x in at2), at2
    assert all(len(set(x["info"]["agent"]["versions"])) == 1 for x in trained[1])  # nothing carried into step 1
