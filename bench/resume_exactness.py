"""How often a resumed run equals the uninterrupted one: the real model's LoRA resume test
(tests/e2e/test_real_model_e2e.py), straight and resumed from its step-1 checkpoint, N times.

    python bench/resume_exactness.py [--runs 10] [-- EXTRA RUN.PY FLAGS]

Prints each pair's step-2 values of the test's tags and, for a pair that differs, every scalar that differs and the
step-2 rollouts that differ (their group, env seed and first words); last line `exact=<pairs equal>/<pairs>`.
"""

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]


def main() -> None:
    from spawn import scalars, torchrun

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("extra", nargs="*", help="more run.py flags (after --)")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("e2e", os.path.join(ROOT, "tests/e2e/test_real_model_e2e.py"))
    test = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test)
    flags = [*test.ARGS, *args.extra]
    exact = 0
    for i in range(args.runs):
        d = tempfile.mkdtemp(prefix="nanosky-resume-")
        r = torchrun([*flags, "--log.run-dir", f"{d}/s"], timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        shutil.copytree(f"{d}/s/checkpoints/step_000001", f"{d}/r/checkpoints/step_000001")
        r = torchrun([*flags, "--log.run-dir", f"{d}/r", "--resume", f"{d}/r/checkpoints/step_000001"], timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        a, b = scalars(f"{d}/s"), scalars(f"{d}/r")
        same = all(a[tag][-1] == b[tag][-1] for tag in test.TAGS)
        exact += same
        print(f"pair {i}: {'exact' if same else 'DIFFERS'}", {t: (a[t][-1][1], b[t][-1][1]) for t in test.TAGS})
        if not same:
            for k in sorted(set(a) & set(b)):
                if a[k][-1] != b[k][-1] and not k.startswith(("timing/", "perf/", "memory/", "sync/")):
                    print(f"  {k}: {a[k][-1][1]} / {b[k][-1][1]}")
            rows = [[json.loads(x) for x in open(f"{d}/{s}/rollouts.jsonl") if '"step": 2' in x] for s in "sr"]
            for x, y in zip(*rows):
                if x["messages"] != y["messages"]:
                    print(f"  rollout group {x['group']} / {y['group']}, seed {x['env_seed']} / {y['env_seed']}:")
                    print(f"    {x['messages'][-1]['content'][:60]!r}\n    {y['messages'][-1]['content'][:60]!r}")
        sys.stdout.flush()
        shutil.rmtree(d)
    print(f"exact={exact}/{args.runs}")


if __name__ == "__main__":
    main()
