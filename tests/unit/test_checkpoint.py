"""nanosky.train.checkpoint_io: exact resume, keep-K, `latest` only on complete checkpoints, kill -9 mid-save, refusals."""

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from spawn import ROOT

from nanosky.train.checkpoint_io import (
    check_compatible,
    list_checkpoints,
    load_checkpoint,
    read_state,
    resolve_checkpoint,
    save_checkpoint,
)

SCRIPT = os.path.join(ROOT, "tests", "scripts", "ckpt_worker.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import ckpt_worker as W  # noqa: E402


def _trained(dist_info, seed=0, steps=2):
    model, opt, sched = W.build(seed, dist_info)
    for _ in range(steps):
        W.train_step(model, opt, sched)
    return model, opt, sched


def test_roundtrip_exact_with_extra_model(dist_info, tmp_path):
    """Policy + critic + schedule + RNGs: the steps after a load equal the steps without save/load, bitwise."""
    root = str(tmp_path / "ckpt")
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    model, opt, sched = _trained(dist_info)
    critic, copt, _ = _trained(dist_info, seed=5, steps=1)
    state = {"step": 2, "data": {"epoch": 0, "pos": 17}, "config": {"model": {"path": "tiny"}}}
    path = save_checkpoint(
        root,
        2,
        model=model,
        optimizer=opt,
        scheduler=sched,
        extra_models={"critic": critic},
        extra_optimizers={"critic": copt},
        state=state,
    )
    ref_losses = [W.train_step(model, opt, sched), W.train_step(critic, copt)]
    ref = W.full_params(model) | {"critic." + k: v for k, v in W.full_params(critic).items()}
    after = (random.random(), float(np.random.rand()), float(torch.rand(())))

    model2, opt2, sched2 = W.build(3, dist_info)
    critic2, copt2, _ = W.build(4, dist_info)
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    got_state = load_checkpoint(
        path,
        model=model2,
        optimizer=opt2,
        scheduler=sched2,
        extra_models={"critic": critic2},
        extra_optimizers={"critic": copt2},
    )
    assert got_state == state
    losses = [W.train_step(model2, opt2, sched2), W.train_step(critic2, copt2)]
    got = W.full_params(model2) | {"critic." + k: v for k, v in W.full_params(critic2).items()}
    assert losses == ref_losses
    for k in ref:
        assert torch.equal(ref[k], got[k]), k
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == after
    assert read_state(path) == state


def test_scheduler_and_optimizer_state_restored(dist_info, tmp_path):
    model, opt, sched = _trained(dist_info, steps=3)
    path = save_checkpoint(str(tmp_path), 3, model=model, optimizer=opt, scheduler=sched, state={})
    model2, opt2, sched2 = W.build(1, dist_info)
    load_checkpoint(path, model=model2, optimizer=opt2, scheduler=sched2)
    assert sched2.last_epoch == sched.last_epoch == 3
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == pytest.approx(1e-2 / 4)
    s, s2 = opt.state[opt.param_groups[0]["params"][0]], opt2.state[opt2.param_groups[0]["params"][0]]
    assert float(s2["step"]) == float(s["step"]) == 3
    assert torch.equal(s["exp_avg_sq"].full_tensor(), s2["exp_avg_sq"].full_tensor())


def test_keep_last_k_and_latest(dist_info, tmp_path):
    root = str(tmp_path / "ckpt")
    model, opt, sched = W.build(0, dist_info)
    for step in range(1, 6):
        save_checkpoint(root, step, model=model, optimizer=opt, scheduler=sched, state={"step": step}, keep=2)
    assert [s for s, _ in list_checkpoints(root)] == [4, 5]
    assert sorted(os.listdir(root)) == ["latest", "step_000004", "step_000005"]  # no tmp/trash leftovers
    assert resolve_checkpoint(root, "latest") == os.path.join(root, "step_000005")
    assert read_state(resolve_checkpoint(root, "latest")) == {"step": 5}


def test_latest_only_points_to_complete(dist_info, tmp_path):
    root = str(tmp_path / "ckpt")
    model, opt, sched = W.build(0, dist_info)
    save_checkpoint(root, 1, model=model, optimizer=opt, state={"step": 1})
    # Leftovers of a crashed save: an uncommitted tmp dir and a step dir without its COMPLETE marker.
    os.makedirs(os.path.join(root, ".tmp-step_000002-deadbeef", "dcp"))
    os.makedirs(os.path.join(root, "step_000003"))
    assert [s for s, _ in list_checkpoints(root)] == [1]
    assert resolve_checkpoint(root, "latest").endswith("step_000001")
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        resolve_checkpoint(root, os.path.join(root, "step_000003"))
    with open(os.path.join(root, "latest"), "w") as f:  # a hand-edited pointer to an incomplete dir is refused
        f.write("step_000003\n")
    with pytest.raises(FileNotFoundError, match="missing or incomplete"):
        resolve_checkpoint(root, "latest")
    # The next save cleans the leftovers up and repoints latest.
    save_checkpoint(root, 4, model=model, optimizer=opt, state={"step": 4}, keep=0)
    assert not any(n.startswith(".") for n in os.listdir(root))
    assert resolve_checkpoint(root, "latest").endswith("step_000004")


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--resume latest requested but no complete checkpoint under"):
        resolve_checkpoint(str(tmp_path / "runs" / "x" / "checkpoints"), "latest")
    with pytest.raises(FileNotFoundError, match="no such checkpoint directory"):
        resolve_checkpoint(str(tmp_path), str(tmp_path / "nope"))


def test_check_compatible_names_the_field():
    saved = {"model": {"path": "a", "lora": {"rank": 8}}, "world_size": 2, "optim": {"betas": [0.9, 0.99]}}
    now = {"model": {"path": "b", "lora": {"rank": 8}}, "world_size": 2, "optim": {"betas": (0.9, 0.99)}}
    check_compatible(saved, now, ["world_size", "model.lora.rank", "optim.betas"])  # tuple vs JSON list: equal
    with pytest.raises(ValueError, match=r"resume refused: model\.path differs \(saved 'a', now 'b'\)"):
        check_compatible(saved, now, ["world_size", "model.path"])
    with pytest.raises(ValueError, match="world_size differs"):
        check_compatible(saved, now | {"world_size": 4}, ["world_size"])
    with pytest.raises(ValueError, match="model.lora.alpha differs"):
        check_compatible(saved, {"model": {"lora": {"alpha": 16}}}, ["model.lora.alpha"])


def test_export_hook_is_inside_the_atomic_dir(dist_info, tmp_path):
    model, opt, _ = W.build(0, dist_info)

    def export(d: str) -> None:
        os.makedirs(d)
        with open(os.path.join(d, "x.txt"), "w") as f:
            f.write("hf")

    path = save_checkpoint(str(tmp_path), 1, model=model, optimizer=opt, state={}, export=export)
    assert open(os.path.join(path, "export", "x.txt")).read() == "hf"


@pytest.mark.parametrize("stage", ["written", "renamed"])
def test_kill_during_save_keeps_previous(dist_info, tmp_path, stage):
    """kill -9 while step 2 is being saved: `latest` still names step 1, which loads to the step-1 weights."""
    root = tmp_path / "ckpt"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, "kill", str(root), stage],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 240
        while not (tmp_path / "READY").exists():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.time() < deadline, "worker never reached the kill point"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    names = os.listdir(root)
    if stage == "written":
        assert any(n.startswith(".tmp-step_000002") for n in names)  # the half-finished save is there, uncommitted
    else:
        assert "step_000002" in names  # committed, but `latest` was not yet moved
    path = resolve_checkpoint(str(root), "latest")
    assert path == str(root / "step_000001")
    model, opt, sched = W.build(42, dist_info)
    assert load_checkpoint(path, model=model, optimizer=opt, scheduler=sched) == {"step": 1}
    want = torch.load(tmp_path / "step1_params.pt")
    got = W.full_params(model)
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_find_export_takes_a_run_dir_a_checkpoint_or_a_model_folder(tmp_path):
    """The evals' --ckpt: what users point at after a run (nanosky.exports.find_export)."""
    from nanosky.exports import find_export

    run = tmp_path / "run"
    for step in ("step_000002", "step_000004"):
        (run / "checkpoints" / step / "export").mkdir(parents=True)
        (run / "checkpoints" / step / "export" / "config.json").write_text("{}")
    (run / "checkpoints" / "latest").write_text("step_000002\n")  # latest names the older one (a resumed run)
    (run / "config.json").write_text('{"steps": 4}')  # a run dir holds its run's config.json: not a model's
    ckpts = run / "checkpoints"
    assert find_export(str(run)) == str(ckpts / "step_000002" / "export")
    assert find_export(str(ckpts / "step_000004")) == str(ckpts / "step_000004" / "export")
    assert find_export(str(ckpts / "step_000004" / "export")) == str(ckpts / "step_000004" / "export")
    (ckpts / "latest").unlink()
    assert find_export(str(run)) == str(ckpts / "step_000004" / "export")  # no latest: the newest complete one
    with pytest.raises(FileNotFoundError, match="no such directory"):
        find_export(str(tmp_path / "nope"))
    (tmp_path / "empty_run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        find_export(str(tmp_path / "empty_run"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match=r"not a model folder .* it holds notes.txt"):
        find_export(str(tmp_path / "other"))
