"""bench/text_math_skyrl_rows.py: text_math's level 1-2 arith and word problems in SkyRL-Gym's gsm8k row layout (not
GSM8K), loaded and scored by `--env skyrl_gym`; the train rows never hold a test question."""

import importlib.util
from pathlib import Path

import pytest

import envs
from envs.text_math import test_problems, validation_problems

pytest.importorskip("datasets", reason="the gyms extra (make test installs it)")
pytest.importorskip("skyrl_gym", reason="the gyms extra (make test installs it)")
pytest.importorskip("pyarrow")

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("text_math_skyrl_rows", ROOT / "bench" / "text_math_skyrl_rows.py")
rows_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rows_script)


def _held(problems):
    return [p for p in problems if p.kind in ("arith", "word") and p.level in (1, 2)]


def test_rows_load_in_skyrl_gym_and_score_with_its_gsm8k_reward(tmp_path):
    counts = rows_script.main(["--train", "20", "--out-dir", str(tmp_path), "--validation"])
    n_test = len(_held(test_problems()))
    assert counts == {"train": 20, "test": n_test, "validation": len(_held(validation_problems()))}
    assert n_test == 73  # the docs' held-out count
    train, test = str(tmp_path / "text_math_skyrl_train.parquet"), str(tmp_path / "text_math_skyrl_test.parquet")
    kw = {"data_path": train, "test_data": test}
    tr = [envs.make("skyrl_gym", "train", i, **kw) for i in range(20)]
    te = [envs.make("skyrl_gym", "test", i, **kw) for i in range(n_test)]
    assert {e.n_rows for e in tr} == {20} and {e.n_rows for e in te} == {n_test}
    held = {p.question for p in test_problems()}
    test_qs = {e.row["extra_info"]["question"] for e in te}
    assert test_qs == {p.question for p in _held(test_problems())}
    for e in tr + te:
        assert e.cls == "gsm8k" and e.task.source == "nanosky/text_math"
        assert e.row["extra_info"]["kind"] in ("arith", "word") and e.row["extra_info"]["level"] in (1, 2)
        (msg,) = e.reset()
        assert msg["role"] == "user" and msg["content"].startswith(e.row["extra_info"]["question"])
        assert msg["content"].endswith('Let\'s think step by step and output the final answer after "####".')
    assert not {e.row["extra_info"]["question"] for e in tr} & held  # no train row is a test question
    for e in (te[0], te[-1], tr[3]):  # SkyRL's own reward: `#### <answer>` succeeds, another number does not
        gt = e.row["reward_spec"]["ground_truth"]
        r = e.step(f"so #### {gt}")
        assert r.reward == 1.0 and r.done and r.info["success"]
        assert e.step(f"#### {int(gt) + 1}").reward == 0.0
        assert e.step(e.row["extra_info"]["answer"]).reward == 1.0  # the worked solution solves its row
