"""Two ranks, two steps of the smoke preset on a tiny Qwen3-MoE (the CPU MoE repack after every sync) and a Mixtral
with a 16-token sliding window (the window in the packed masks; its experts synced under the checkpoint's names,
not transformers' stacked ones): the sync probe holds and packing stays on."""

import json
import os

import pytest
from families import build
from spawn import scalars, torchrun


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral_swa"])
def test_two_ranks_train_a_real_family(family, tmp_path):
    model = build(family, str(tmp_path))
    run_dir = str(tmp_path / "run")
    r = torchrun(
        [
            "--preset",
            "smoke",
            "--precision",
            "fp32",  # fp32 agreement asserted below (bf16: test_precision_e2e.py)
            "--steps",
            "2",
            "--model.path",
            model,
            "--log.run-dir",
            run_dir,
            "--log.ckpt-every",
            "0",
            "--eval.limit",
            "4",
        ]
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    s = scalars(run_dir)
    assert [st for st, _ in s["rollout/logprob_diff_mean"]] == [0, 1, 2]  # the build's sync and both steps'
    assert all(v < 1e-4 for _, v in s["rollout/logprob_diff_max"]), s["rollout/logprob_diff_max"]
    assert json.load(open(os.path.join(run_dir, "config.json")))["optim"]["packing"] == "prefix"  # verified exact
