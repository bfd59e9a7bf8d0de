"""Every trainer path an --algo preset can take runs end to end (1 rank, 2 steps): critic (ppo), reference +
KL-in-reward (reinforce_pp), dynamic sampling + overlong punishment (dapo), sequence-level losses (gspo, sapo)."""

import json
import math
import os
import time

import pytest
from spawn import python, scalars


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "reinforce_pp", "dapo", "gspo", "sapo"])
def test_preset_trains(algo, tmp_path):
    run_dir = str(tmp_path / algo)
    args = [
        "--preset",
        "smoke",
        "--algo",
        algo,
        "--steps",
        "2",
        "--log.run-dir",
        run_dir,
        "--rollout.prompts-per-step",
        "4",
        "--eval.limit",
        "4",
        "--log.ckpt-every",
        "0",
        "--envpool.workers",
        "0",
    ]
    if algo == "dapo":  # the smoke preset's 32-token responses need a shorter overlong band than DAPO's 32
        args += ["--algorithm.overlong-cache-len", "8"]
    r = python(args)
    assert r.returncode == 0, r.stderr[-4000:]
    s = scalars(run_dir)
    assert all(math.isfinite(v) for _, v in s["train/pg_loss"])
    if algo == "ppo":
        assert "train/value_loss" in s and "train/explained_var" in s
    if algo == "dapo":
        assert "train/dropped_groups" in s and "train/gen_rounds" in s
    if algo == "reinforce_pp":
        assert json.load(open(os.path.join(run_dir, "config.json")))["algorithm"]["kl_in_reward"]


@pytest.mark.slow
def test_neg_adv_scale_zero_trains_only_on_better_than_average_samples(tmp_path):
    """--algorithm.neg-adv-scale 0 reaches the update: every loss token's advantage is >= 0 while the rewards still
    spread (without it the groups' below-average samples carry negative advantages), and rows left at 0 are skipped."""
    run_dir = str(tmp_path / "pos")
    args = ["--preset", "smoke", "--steps", "2", "--log.run-dir", run_dir]
    args += ["--algorithm.neg-adv-scale", "0", "--eval.limit", "4", "--envpool.workers", "0"]
    r = python(args)
    assert r.returncode == 0, r.stderr[-4000:]
    s = scalars(run_dir)
    assert all(v >= 0 for _, v in s["train/adv_min"])
    spread = [step for step, v in s["train/adv_std"] if v > 0]
    assert spread, "no group had any spread: the run tested nothing"
    assert all(v > 0 for step, v in s["train/adv_mean"] if step in spread)
    assert all(0 < v < 1 for step, v in s["train/skipped_rows_frac"] if step in spread)


@pytest.mark.slow
def test_lora_training_syncs_merged_weights(tmp_path):
    """LoRA through peft + FSDP2: the sync streams merged weights; the probe (which fails the run on a mismatch)
    must see the engine agree with the trainer after every update, and the adapter is saved in peft format."""
    run_dir = str(tmp_path / "lora")
    args = [
        "--preset",
        "smoke",
        "--precision",
        "fp32",  # the fp32 agreement is asserted (bf16: test_precision_e2e.py)
        "--steps",
        "2",
        "--log.run-dir",
        run_dir,
        "--lora.rank",
        "8",
        "--optim.lr",
        "1e-2",
        "--eval.limit",
        "4",
        "--envpool.workers",
        "0",
    ]
    r = python(args)
    assert r.returncode == 0, r.stderr[-4000:]
    s = scalars(run_dir)
    assert all(v < 1e-3 for _, v in s["rollout/logprob_diff_mean"])
    export = os.path.join(run_dir, "checkpoints", "step_000002", "export")
    assert os.path.exists(os.path.join(export, "adapter", "adapter_config.json"))
    assert os.path.exists(os.path.join(export, "model.safetensors"))


def test_dry_run_uses_the_longest_sequences(tmp_path):
    run_dir = str(tmp_path / "dry")
    args = [
        "--preset",
        "smoke",
        "--dry-run",
        "--log.run-dir",
        run_dir,
        "--envpool.workers",
        "0",
    ]
    r = python(args)
    assert r.returncode == 0, r.stderr[-4000:]
    s = scalars(run_dir)
    assert [st for st, _ in s["train/pg_loss"]] == [1]
    assert s["train/response_len"][0][1] == 32  # every response ran to max_new_tokens
    assert all(f"memory/{p}_gib" in s for p in ("generate", "logprob", "train", "sync"))
    assert "dry run ok" in r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tool_use", "webshop_lite", "alfworld_lite"])
def test_agent_env_presets_train(preset, tmp_path):
    """The multi-turn env presets train end to end (bundled agent model, env pool workers, tools)."""
    run_dir = str(tmp_path / preset)
    small = "--steps 1 --rollout.prompts-per-step 2 --rollout.group-size 2 --eval.limit 2 --eval.every 0"
    args = ["--preset", preset, "--log.run-dir", run_dir, *small.split()]
    args += ["--envpool.workers", "1", "--engine.kv-cache-gib", "0.25"]  # env steps in a worker, as in real runs
    r = python(args)
    assert r.returncode == 0, r.stderr[-4000:]
    s = scalars(run_dir)
    assert all(math.isfinite(v) for _, v in s["train/pg_loss"])
    assert s["rollout/turns_mean"][-1][1] >= 1
    assert s["envs/failed"][-1][1] == 0
    if preset == "tool_use":
        assert "tools/invalid_rate" in s and "tools/calls_per_traj" in s
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert 0.0 <= summary["eval_accuracy_final"] <= 1.0


@pytest.mark.slow
def test_gigpo_trains_on_alfworld_lite_at_two_ranks(tmp_path):
    """`--algo gigpo` end to end in concat mode (the preset's step-wise mode runs in test_stepwise_rollout_trains):
    state keys from the env pool, step spans in concatenated rows, anchor metrics reduced over 2 ranks."""
    from spawn import torchrun

    run_dir = str(tmp_path / "gigpo")
    small = "--steps 2 --rollout.prompts-per-step 2 --rollout.group-size 2 --rollout.max-turns 6 --eval.every 0"
    # progress_reward pays each subgoal reached once: rewards differ between a group's episodes (success is rare)
    r = torchrun(
        [
            "--preset",
            "alfworld_lite",
            "--algo",
            "gigpo",
            "--log.run-dir",
            run_dir,
            *small.split(),
            "--rollout.mode",
            "concat",
            "--envpool.workers",
            "1",
            "--eval.limit",
            "2",
            "--env-kwargs.progress-reward",
            "0.2",
        ]
    )
    assert r.returncode == 0, r.stderr[-4000:]
    s = scalars(run_dir)
    assert [step for step, _ in s["train/pg_loss"]] == [1, 2]
    assert all(math.isfinite(v) for _, v in s["train/pg_loss"])
    # A group's episodes start in the same state: its first steps share an anchor, so some anchors hold more than
    # one step (state keys that never matched, or never reached the trainer, give 1.0 and 0.0 here).
    assert all(v > 1.0 for _, v in s["gigpo/anchor_size_mean"])
    assert all(0.0 < v <= 1.0 for _, v in s["gigpo/anchor_nonsingleton_frac"])
    # Where some row carries an advantage, a group's returns differ, and so do its first steps' (a dead step term
    # would leave the step advantages all 0 here).
    signal = {step for step, v in s["train/skipped_rows_frac"] if v < 1.0}
    assert signal and all(v > 0.0 for step, v in s["gigpo/step_adv_std"] if step in signal)
    assert json.load(open(os.path.join(run_dir, "config.json")))["algorithm"]["adv_estimator"] == "gigpo"


@pytest.mark.slow
@pytest.mark.parametrize("algo,nproc", [("gigpo", 2), ("reinforce_pp", 2), ("ppo", 1)])
def test_stepwise_rollout_trains(algo, nproc, tmp_path):
    """`--rollout.mode stepwise`: one row per turn from a 1-turn history window; the episode-view estimators (with
    KL-in-reward gathered over ranks: reinforce_pp), GiGPO over step rows, and GAE on the rows (ppo). The gigpo run
    also constrains its turns to the admissible actions (`--rollout.constrain-actions`)."""
    from spawn import torchrun

    run_dir = str(tmp_path / algo)
    small = "--steps 2 --rollout.prompts-per-step 2 --rollout.group-size 2 --rollout.max-turns 5 --eval.every 0"
    r = torchrun(
        [
            "--preset",
            "alfworld_lite",
            "--precision",
            "fp32",  # the constrained turns' fp32 agreement is asserted (bf16: test_precision_e2e.py)
            "--algo",
            algo,
            "--log.run-dir",
            run_dir,
            *small.split(),
            "--rollout.mode",
            "stepwise",
            "--rollout.history-window",
            "1",
            "--envpool.workers",
            "1",
            "--eval.limit",
            "2",
            "--log.samples-per-step",
            "2",
        ]
        + ["--rollout.constrain-actions", "--optim.no-skip-zero-adv"] * (algo == "gigpo"),
        nproc=nproc,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    s = scalars(run_dir)
    assert all(math.isfinite(v) for _, v in s["train/pg_loss"]) and len(s["train/pg_loss"]) == 2
    if algo == "gigpo":  # the trainer scores the constrained turns as the engine sampled them
        assert all(v < 1e-4 for _, v in s["train/mismatch/mismatch_abs_max"])
        eps = [json.loads(line) for line in open(os.path.join(run_dir, "rollouts.jsonl"))]
        replies = [m for e in eps for m in e["messages"][1:] if m["role"] == "user"]
        assert replies and not any(m["content"].startswith("Nothing happens") for m in replies)
    assert s["rollout/turns_mean"][-1][1] >= 1
    if algo == "gigpo":
        assert all(v >= 1.0 for _, v in s["gigpo/anchor_size_mean"])
        eps = [json.loads(line) for line in open(os.path.join(run_dir, "rollouts.jsonl"))]
        # each turn's advantage, for the logs and the viewer
        for e in (e for e in eps if e["split"] == "train"):
            assert all("advantage" in x for x in e["turn_log"])
            assert all(a is not None for a, m in zip(e["tokens"]["adv"], e["tokens"]["mask"]) if m)
    if algo == "ppo":
        assert "train/value_loss" in s
    cfg = json.load(open(os.path.join(run_dir, "config.json")))
    assert cfg["rollout"]["mode"] == "stepwise" and cfg["algorithm"]["norm_const"] == cfg["rollout"]["max_new_tokens"]
    rollouts = [json.loads(line) for line in open(os.path.join(run_dir, "rollouts.jsonl"))]
    assert rollouts and all("steps" not in x for x in rollouts)  # episodes, readable, without the token ids


@pytest.fixture(scope="module")
def swe_run(tmp_path_factory):
    from spawn import torchrun

    run_dir = str(tmp_path_factory.mktemp("swe") / "swe")
    small = "--steps 2 --rollout.prompts-per-step 2 --rollout.group-size 2 --eval.every 0 --eval.limit 2"
    r = torchrun(
        [
            "--preset",
            "swe",
            "--precision",
            "fp32",  # the constrained turns' fp32 agreement is asserted (bf16: test_precision_e2e.py)
            "--log.run-dir",
            run_dir,
            *small.split(),
            "--envpool.workers",
            "1",
            "--env-kwargs.max-turns",
            "3",
            "--log.samples-per-step",
            "2",
            "--rollout.constrain-actions",
            "--optim.no-skip-zero-adv",  # every row scored: the constrained turns' agreement is always measured
        ]
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return run_dir, r.stdout + r.stderr


@pytest.mark.slow
def test_swe_trains_at_two_ranks(swe_run):
    """`--preset swe` end to end at 2 ranks: generated bug-fix tasks in the env pools (sandboxed bash, the editor,
    grading at submit), multi-turn rows, the env-step latency and its share logged. Constrained: every turn is one
    well-formed call, and the trainer scores the multi-turn rows under the grammar's masks as the engine did."""
    from envs.tools import parse_tool_calls

    run_dir, _ = swe_run
    s = scalars(run_dir)
    assert [step for step, _ in s["train/pg_loss"]] == [1, 2]
    assert all(math.isfinite(v) for _, v in s["train/pg_loss"])
    assert s["envs/failed"][-1][1] == 0 and all(v > 0 for _, v in s["envs/step_latency_s"])
    assert all(0 < v <= 1 for _, v in s["envs/step_share"])
    assert all(1 <= v <= 3 for _, v in s["rollout/turns_mean"])
    rollouts = [json.loads(line) for line in open(os.path.join(run_dir, "rollouts.jsonl"))]
    assert rollouts and all(x["messages"][0]["content"].startswith("Fix the issue") for x in rollouts)
    assert all(v < 1e-4 for _, v in s["train/mismatch/mismatch_abs_max"])
    turns = [
        (m, log)
        for x in rollouts
        for m, log in zip([m for m in x["messages"] if m["role"] == "assistant"], x["turn_log"])
    ]
    finished = [m["content"] for m, log in turns if log["finish_reason"] == "stop"]
    assert finished and all(len(c := parse_tool_calls(t)) == 1 and c[0].error is None for t in finished)
    errors = [c["error"] or "" for x in rollouts for c in x["info"].get("calls", [])]
    assert not any(e.startswith(("bad arguments", "unknown tool")) for e in errors)


@pytest.mark.slow
def test_the_viewer_shows_the_swe_run_in_a_browser(swe_run):
    """The page a real run made, as a user checks it (headless Chromium): its steps and groups, a tool call and its
    output, a filter that narrows the list, and a sampled token's hover value equal to the record's."""
    from browser import artifact, driver, open_page

    from nanosky.view import write

    run_dir, out = swe_run
    assert "-m nanosky.view " + run_dir in out  # the final lines name the viewer beside TensorBoard
    recs = [json.loads(x) for x in open(os.path.join(run_dir, "rollouts.jsonl"))]
    train = [r for r in recs if r["split"] == "train"]
    t0 = time.perf_counter()
    page = write(run_dir)
    written = time.perf_counter() - t0
    d = driver()
    try:
        seconds = open_page(d, str(page))
        css = lambda q: d.find_elements("css selector", q)  # noqa: E731
        assert len(css("#steps tr[data-step]")) == 2
        last = max(r["step"] for r in train)  # the page opens on the newest step
        assert len(css(".group")) == len({r["group"] for r in train if r["step"] == last})
        for card in css(".card"):  # an episode with a call and the tool's output
            card.click()
            if css(".msg.tool") and css(".msg.assistant .call"):
                break
        call, output = css(".msg.assistant .call")[0], css(".msg.tool")[0]
        assert call.is_displayed() and "<tool_call>" in call.text and output.text.strip()
        rec = recs[int(css("#tokens")[0].get_attribute("data-rec"))]
        spans = css("#tokens .tok")
        i = next(k for k, sp in enumerate(spans) if sp.get_attribute("data-v"))  # the first sampled token
        assert float(spans[i].get_attribute("data-v")) == pytest.approx(rec["tokens"]["adv"][i], abs=1e-9)
        assert str(rec["tokens"]["adv"][i]) in spans[i].get_attribute("title")
        assert css(".tok.obs")  # observation tokens, shown as not trained
        before = len(css("#steps tr[data-step]"))
        d.find_element("id", "f-step-min").send_keys("2")
        assert len(css("#steps tr[data-step]")) == 1 < before
        d.save_screenshot(artifact("viewer-swe.png"))
    finally:
        d.quit()
    print(f"viewer: page {os.path.getsize(page) / 1e3:.0f} kB written in {written:.2f} s, rendered in {seconds:.2f} s")
