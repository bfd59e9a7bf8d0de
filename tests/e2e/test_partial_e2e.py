"""Partial rollouts at 2 ranks through torchrun (nanosky/partial.py): K = 0 is the synchronous step exactly, and
tool_use with K = 1, F = 1.5 carries episodes across steps within the staleness bound, corrected (TIS), with a
checkpoint step that drains."""

import json
import os

from spawn import scalars, torchrun

from nanosky.seeds import derive_seed

SMOKE = ["--preset", "smoke", "--precision", "fp32", "--steps", "3", "--log.ckpt-every", "0", "--eval.limit", "4"]
TOOL = ["--preset", "tool_use", "--steps", "4", "--rollout.prompts-per-step", "8", "--rollout.group-size", "4"]
TOOL += ["--eval.every", "0", "--eval.limit", "4", "--eval.n-samples", "1", "--log.ckpt-every", "2"]
TOOL += ["--rollout.max-staleness", "1", "--rollout.oversample", "1.5", "--log.samples-per-step", "100"]


def _records(run_dir) -> list[dict]:
    return [json.loads(x) for x in open(os.path.join(run_dir, "rollouts.jsonl"))]


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
    wa = open(os.path.join(a, "checkpoints", "step_000003", "export", "model.safetensors"), "rb").read()
    wb = open(os.path.join(b, "checkpoints", "step_000003", "export", "model.safetensors"), "rb").read()
    assert wa == wb


def test_tool_use_carries_episodes_within_the_bound_and_drains_at_a_checkpoint(tmp_path):
    run_dir = str(tmp_path / "k1")
    r = torchrun([*TOOL, "--log.run-dir", run_dir], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    s = scalars(run_dir)
    carried = dict(s["rollout/carried"])
    assert [st for st, _ in s["rollout/carried"]] == [1, 2, 3, 4]
    assert carried[1] == 0 and carried[3] == 0  # the first step, and the one after the checkpoint (step 2 drained)
    assert carried[2] > 0 or carried[4] > 0, carried  # episodes were cut and resumed
    assert all(v <= 1 for _, v in s["rollout/staleness_max"]), s["rollout/staleness_max"]
    assert all(0 < v for _, v in s["train/is_weight_mean"])  # TIS, on by default with K > 0
    assert all(v <= 2.0 for _, v in s["train/is_weight_max"])  # the cap
    groups = [(x["step"], x["group"]) for x in _records(run_dir) if x["split"] == "train"]
    trained = {}
    for step, g in groups:
        trained.setdefault(g, set()).add(step)
    assert all(len(steps) == 1 for steps in trained.values()), trained  # no group trained at two steps
    assert len(trained) == 4 * 4  # rank 0's share of every step (4 groups), all logged
