"""docs/your_env.md, as a new user follows it: the page's env file, saved in a folder of its own, trained from that
folder with `--plugins my_env` (imported from the working directory, no PYTHONPATH) by the venv's torchrun by path.
With questions the model never solves, every group's rewards are equal, and the warning says so after 3 steps."""

import os
import re
import subprocess
import sys

from spawn import ROOT, child_env, scalars

DOC = os.path.join(ROOT, "docs", "your_env.md")


def env_file() -> str:
    text = open(DOC).read()
    block = re.search(r"```python\n(# my_env\.py.*?)```", text, re.S)
    assert block, "docs/your_env.md lost its my_env.py block"
    return block[1]


def test_the_guide_env_trains_from_its_own_folder_and_warns_without_signal(tmp_path):
    code = env_file()
    assert len(code.strip().splitlines()) <= 30  # "an env in 20 lines" (plus imports and blank lines)
    (tmp_path / "my_env.py").write_text(code)
    venv_bin = os.path.dirname(sys.executable)
    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    run_py = os.path.join(ROOT, "run.py")
    flags = [
        "--preset",
        "smoke",
        "--plugins",
        "my_env",
        "--env",
        "add",
        "--env-kwargs",
        "max_n",
        "100000000",
        "--rollout.prompts-per-step",
        "4",
        "--eval.limit",
        "4",
        "--log.ckpt-every",
        "0",
    ]
    cmd = [os.path.join(venv_bin, "torchrun"), "--standalone", "--nproc_per_node", "2", run_py, *flags]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = tmp_path / "runs" / "add-grpo-s0"
    assert (run_dir / "summary.json").is_file()
    # 9-digit sums: never right, so every group's rewards are equal and nothing is learned
    assert scalars(str(run_dir))["train/skipped_rows_frac"][-1][1] == 1.0
    out = r.stdout + r.stderr
    assert out.count("for 3 steps in a row every group's rewards were equal") == 1, out[-3000:]

    def run_py_once(*extra):
        return subprocess.run(
            [sys.executable, run_py, *flags, *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    r = run_py_once()  # the same run dir again: refused, pointing at the ways on
    assert r.returncode == 2 and "holds an earlier run" in r.stderr and "--log.overwrite" in r.stderr, r.stderr
    r = subprocess.run(
        [sys.executable, run_py, "--plugins", "my_envv", "--env", "add"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "nanosky: --plugins my_envv: no module named 'my_envv' in the working directory or on PYTHONPATH"
    ], r.stderr
