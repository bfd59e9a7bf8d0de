"""The oracle judge (docs/judge.md): text_math learning with its rewards from a judge that returns the env's own
reward, beside a run on the env's reward, same seeds. The judge's plumbing (prompts, ids, parsing, the gather, the
masking) must not change what is learnt: a tiny model is no real judge, so this is what can be proven here.

    python bench/oracle_judge.py [--seeds 0 1] [--sources env oracle] [-- EXTRA RUN.PY FLAGS]   # `make demo` x4, ~25 min

The oracle is a scripted OpenAI-compatible server (evals/scripted.py). It regenerates the run's problems from their
seeds (as nanosky/collect.py draws them) and the test split, so it knows each question's answer, and scores each
attempt with text_math's own checker (1 right, 0.1 well-formed but wrong, 0 else). Prints, per seed and reward
source: held-out accuracy (the env's checker) before and after, the last steps' reward, the judge's time per step
and its share of the step; the last line is the largest held-out difference between the two sources.
"""

import argparse
import json
import re
import statistics
import sys
import tempfile

from launch import run_py, scalars

from envs.text_math import score, test_problems, train_problem
from evals.scripted import ScriptedServer
from nanosky.presets import PRESETS
from nanosky.seeds import derive_seed


def answers(seed: int, steps: int, prompts: int, kinds: tuple[str, ...]) -> dict[str, str]:
    """question -> answer for every problem the run can draw (its train steps' and the test split's)."""
    out = {p.question: p.answer for p in test_problems()}
    for step in range(steps + 2):
        for j in range(prompts):
            p = train_problem(derive_seed(seed, step, 0, j), kinds)
            out[p.question] = p.answer
    return out


def oracle(known: dict[str, str]):
    def reply(messages: list[dict]) -> str:
        body = messages[-1]["content"]
        question = re.search(r"\[user\]\n(.*?)\n</task>", body, re.S).group(1).strip()
        attempts = re.findall(r"<attempt id=(\d+)>\n(.*?)\n</attempt>", body, re.S)
        scores = [
            {"trajectory_id": int(i), "explanation": "oracle", "score": score(a, known[question])[0]}
            for i, a in attempts
        ]
        return json.dumps({"scores": scores})

    return reply


def run(seed: int, judge_url: str | None, extra: list[str]) -> dict[str, list[tuple[int, float]]]:
    run_dir = tempfile.mkdtemp(prefix="nanosky-oracle-")
    flags = ["--preset", "demo", "--seed", str(seed), "--log.run-dir", run_dir, *extra]
    if judge_url:
        flags += ["--reward.judge", "group", "--reward.judge-url", judge_url, "--reward.judge-only"]
    r = run_py(2, flags)
    if r.returncode != 0:
        sys.exit(r.stderr[-4000:])
    return scalars(run_dir)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--sources", nargs="+", choices=["env", "oracle"], default=["env", "oracle"])
    ap.add_argument("extra", nargs="*", help="more run.py flags (after --)")
    args = ap.parse_args()
    cfg = PRESETS["demo"]()
    kinds = tuple(json.loads(cfg.env_kwargs["kinds"]))
    print("| seed | reward from | held-out acc, step 0 → end | reward, last 5 steps | judge s/step | judge share |")
    print("|---|---|---|---|---|---|")
    diffs = []
    for seed in args.seeds:
        known = answers(seed, cfg.steps, cfg.rollout.prompts_per_step, kinds)
        finals = {}
        for source in [{"env": "env", "oracle": "oracle judge"}[x] for x in args.sources]:
            if source == "env":
                m = run(seed, None, args.extra)
            else:
                with ScriptedServer(oracle(known)) as url:
                    m = run(seed, url, args.extra)
            acc = m["eval/accuracy"]
            finals[source] = acc[-1][1]
            reward = statistics.mean(v for _, v in m["train/reward_mean"][-5:])
            judge_s = statistics.median(v for _, v in m["timing/judge_s"]) if "timing/judge_s" in m else None
            share = statistics.median(v for _, v in m["judge/step_share"]) if "judge/step_share" in m else None
            print(
                f"| {seed} | {source} | {acc[0][1]:.3f} → {acc[-1][1]:.3f} | {reward:.3f} | "
                f"{'-' if judge_s is None else f'{judge_s:.2f}'} | {'-' if share is None else f'{share:.1%}'} |",
                flush=True,
            )
        if len(finals) == 2:
            diffs.append(abs(finals["env"] - finals["oracle judge"]))
    if diffs:
        print(f"max |held-out accuracy, env - oracle judge| = {max(diffs):.3f}")


if __name__ == "__main__":
    main()
