"""The generated SWE tasks and the shipped suite under the scripted expert and an empty patch (issue 15's first two
targets), through the real env: sandboxed tools, the harness's grading.

    python bench/swe_tasks.py [--seeds 30] [--workers 2]      # make bench-swe

Rows: level 1-3 of the train split (generated), of held-out generated bugs (`test_suite generated`), and the
shipped swe_mini suite (the test split). Prints resolve rates, the expert's turns, and seconds per episode.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SUBMIT = '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'


def episode(job: tuple) -> tuple[bool, bool, int, float, float]:
    """(expert resolved, empty submit resolved, expert turns, expert seconds, grading seconds) of one instance."""
    import envs

    split, seed, kw = job
    out = []
    for policy in ("expert", "empty"):
        env = envs.make("swe", split, seed, **kw)
        t0 = time.perf_counter()
        env.reset()
        res = None
        while res is None or not res.done:
            res = env.step(env.expert_action() if policy == "expert" else SUBMIT)
        out.append((res.reward == 1.0, env.turn, time.perf_counter() - t0, res.info.get("grade_s", 0.0)))
    (ok, turns, secs, grade_s), (empty_ok, *_) = out
    return ok, empty_ok, turns, secs, grade_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    from multiprocess import Pool

    from envs.swe import mini_suite

    rows = [(f"train, level {lv}", [("train", s, {"level": lv}) for s in range(args.seeds)]) for lv in (1, 2, 3)]
    rows += [
        (
            f"held-out generated, level {lv}",
            [("test", s, {"level": lv, "test_suite": "generated"}) for s in range(args.seeds)],
        )
        for lv in (1, 2, 3)
    ]
    rows += [("swe_mini (test split)", [("test", s, {}) for s in range(len(mini_suite()))])]
    print("| instances | n | expert resolves | empty patch resolves | expert turns | s / expert episode | grading s |")
    print("|---|---|---|---|---|---|---|")
    with Pool(args.workers) as pool:
        for name, jobs in rows:
            res = pool.map(episode, jobs)
            n = len(res)
            print(
                f"| {name} | {n} | {sum(r[0] for r in res) / n:.0%} | {sum(r[1] for r in res) / n:.0%} | "
                f"{sum(r[2] for r in res) / n:.1f} | {sum(r[3] for r in res) / n:.2f} | {sum(r[4] for r in res) / n:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
