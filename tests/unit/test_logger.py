"""RunLogger: what rank 0 writes, and the progress bar of a resumed run."""

import json
import os

from nanosky.logger import RunLogger


def test_resumed_bar_counts_from_the_resume_step(tmp_path, capsys):
    log = RunLogger(str(tmp_path), enabled=True, total_steps=10, use_tqdm=True)
    log.resumed_at(4)
    log.progress({"reward": 0.5})
    assert log.bar.n == 5  # step 5 of 10, not 1 of 10
    log.close()
    assert "5/10" in capsys.readouterr().err


def test_disabled_logger_writes_nothing(tmp_path):
    log = RunLogger(str(tmp_path / "r"), enabled=False, total_steps=3)
    log.resumed_at(2)
    log.scalars(1, {"a": 1.0})
    log.write_json("summary.json", {"a": 1})
    log.close()
    assert not os.path.exists(tmp_path / "r")


def test_scalars_and_summary_land_in_the_run_dir(tmp_path):
    log = RunLogger(str(tmp_path), enabled=True, total_steps=3, use_tqdm=False)
    log.scalars(1, {"train/reward_mean": 0.25})
    log.write_json("summary.json", {"steps": 3})
    log.close()
    assert json.load(open(tmp_path / "summary.json")) == {"steps": 3}
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path))
