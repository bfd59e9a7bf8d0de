"""Expert and random-valid-action baselines of webshop_lite and alfworld_lite on their test splits (issue 5).

    python bench/env_baselines.py [--episodes 200]

The trained-model figure comes from a training run's held-out eval (`run.py --preset webshop_lite` etc.).
"""

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import envs  # noqa: E402
from envs.base import run_policy  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=200)
    args = ap.parse_args()
    seeds = range(args.episodes)
    print("| env | policy | success rate | mean reward | mean steps |")
    print("|---|---|---|---|---|")
    for label, name, kw in (
        ("webshop_lite", "webshop_lite", {}),
        ("webshop_lite (page_size 3)", "webshop_lite", {"page_size": 3}),
        ("alfworld_lite", "alfworld_lite", {}),
        # `--preset alfworld_lite`'s rooms and held-out split: the chance level of its runs
        ("alfworld_lite (rooms of 3-5, unseen)", "alfworld_lite", {"n_receptacles": [3, 5], "test_set": "unseen"}),
    ):
        rng = random.Random(0)
        for policy, fn in (
            ("expert", lambda env: env.expert_action()),
            ("random valid action", lambda env, rng=rng: rng.choice(env.available_actions())),
        ):
            r = run_policy(lambda seed, name=name, kw=kw: envs.make(name, "test", seed, **kw), fn, seeds)
            print(
                f"| {label} | {policy} | {r['success_rate']:.3f} | {r['mean_reward']:.3f} | {r['mean_steps']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
