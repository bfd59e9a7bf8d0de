"""End to end: `torchrun --nproc_per_node 2 run.py` on the bundled tiny model, CPU, a few GRPO steps."""

import json
import math
import os
import subprocess
import sys

import pytest
from spawn import ROOT, child_env, scalars, torchrun

REQUIRED_TAGS = [
    "train/reward_mean",
    "train/success_rate",
    "train/response_len",
    "train/entropy",
    "train/clip_frac",
    "train/grad_norm",
    "train/pg_loss",
    "rollout/logprob_diff_mean",
    "rollout/logprob_diff_max",
    "timing/generate_s",
    "timing/train_s",
    "timing/sync_s",
    "timing/step_s",
    "perf/tokens_per_s",
    "eval/accuracy",
]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("run") / "smoke")
    kl, evals = ["--algorithm.kl-coef", "0.001"], ["--log.eval-samples", "100"]
    fp32 = ["--precision", "fp32"]  # the fp32 engine-trainer agreement is asserted (bf16: test_precision_e2e.py)
    r = torchrun(["--preset", "smoke", *fp32, "--log.run-dir", run_dir, *kl, *evals])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return run_dir


@pytest.mark.slow
def test_two_rank_run_logs_and_syncs(smoke_run):
    s = scalars(smoke_run)
    missing = [t for t in REQUIRED_TAGS + ["train/kl"] if t not in s]
    assert not missing, missing
    steps = [st for st, _ in s["train/pg_loss"]]
    assert steps == [1, 2, 3]
    for tag in ("train/pg_loss", "train/grad_norm", "train/kl", "train/entropy"):
        assert all(math.isfinite(v) for _, v in s[tag]), tag
    assert all(v > 0 for _, v in s["train/grad_norm"])
    # weights really reached vLLM: after every sync the engine scores the probe like the trainer does
    assert all(v < 1e-3 for _, v in s["rollout/logprob_diff_mean"])
    # every sync pushed each weight once at 4 bytes (the tied head's as its own tensor, as vLLM takes it), and its
    # two parts fit in the phase's time
    from safetensors import safe_open

    with safe_open(os.path.join(smoke_run, "checkpoints", "step_000003", "export", "model.safetensors"), "pt") as f:
        sizes = {k: math.prod(f.get_slice(k).get_shape()) for k in f.keys()}
    lo, hi = 4 * sum(sizes.values()) / 1e6, 4 * (sum(sizes.values()) + sizes["model.embed_tokens.weight"]) / 1e6
    assert [st for st, _ in s["sync/mbytes"]] == [0, 1, 2, 3] and all(lo <= v <= hi for _, v in s["sync/mbytes"])
    phase = dict(s["timing/sync_s"])
    assert all(p + q <= phase[st] for (st, p), (_, q) in zip(s["sync/push_s"][1:], s["sync/probe_s"][1:]))
    summary = json.load(open(os.path.join(smoke_run, "summary.json")))
    assert summary["steps"] == 3 and summary["world_size"] == 2
    assert 0.0 <= summary["eval_accuracy_final"] <= 1.0 and summary["median_step_s"] > 0
    lines = open(os.path.join(smoke_run, "rollouts.jsonl")).read().splitlines()
    rec = json.loads(lines[-1])
    assert {"messages", "reward", "stop_reason"} <= set(rec)
    # --log.eval-samples 100 keeps every eval episode of rank 0's share (test seeds 0, 2, ..., 14 of 16)
    evals = [json.loads(x) for x in lines if '"split": "eval"' in x]
    for step in (0, 3):
        seeds = sorted(r["env_seed"] for r in evals if r["step"] == step and r["split"] == "eval")
        assert seeds == list(range(0, 16, 2)), (step, seeds)


@pytest.mark.slow
def test_the_step_sample_is_whole_groups_with_their_token_values(smoke_run):
    """What the viewer colours tokens by: per sampled token, the engine's and the trainer's log p (on-policy, fp32:
    equal within the probe's tolerance), one advantage per sequence (GRPO), and the entropy; whole groups."""
    cfg = json.load(open(os.path.join(smoke_run, "config.json")))
    # what the build decided, beside the config as parsed: prefix-packed, attention by segment (checked at build)
    plan = json.load(open(os.path.join(smoke_run, "plan.json")))
    assert (plan["packing"], plan["attention"]) == ("prefix", "grouped") and 0 < plan["probe_tol"] < 1e-3
    assert cfg["optim"]["packed_attention"] == "auto"  # the flag as given, not overwritten by the decision
    recs = [json.loads(x) for x in open(os.path.join(smoke_run, "rollouts.jsonl")) if '"split": "train"' in x]
    assert sorted({r["step"] for r in recs}) == [1, 2, 3]
    for step in (1, 2, 3):
        groups = {}
        for r in recs:
            if r["step"] == step:
                groups.setdefault(r["group"], []).append(r)
        assert groups and all(len(g) == cfg["rollout"]["group_size"] for g in groups.values())  # whole groups
        assert sum(len(g) for g in groups.values()) >= cfg["log"]["samples_per_step"]
    for r in recs:
        tok = r["tokens"]
        n = len(tok["ids"])
        assert all(len(tok[k]) == n for k in ("mask", "lp", "lp_train", "adv", "ent"))
        on = [t for t in range(n) if tok["mask"][t]]
        assert on and all(tok["mask"][t] == 0 for t in range(r["prompt_len"]))
        assert all(tok["lp"][t] is None and tok["adv"][t] is None for t in range(n) if t not in on)
        assert max(abs(tok["lp"][t] - tok["lp_train"][t]) for t in on) < 2e-3
        assert len({tok["adv"][t] for t in on}) == 1  # GRPO: the sequence's advantage on every token
        assert all(tok["ent"][t] >= 0 for t in on)
    for g in {(r["step"], r["group"]) for r in recs}:  # group-normalised: the advantages sum to ~0
        advs = [next(a for a in r["tokens"]["adv"] if a is not None) for r in recs if (r["step"], r["group"]) == g]
        assert abs(sum(advs)) < 1e-2


@pytest.mark.slow
def test_checkpoint_loads_in_transformers_and_vllm(smoke_run, tmp_path):
    ckpt = os.path.join(smoke_run, "checkpoints", "step_000003", "export")
    assert os.path.exists(os.path.join(smoke_run, "checkpoints", "step_000002", "export", "model.safetensors"))
    assert json.load(open(os.path.join(smoke_run, "summary.json")))["final_checkpoint"].endswith(ckpt[-30:])
    code = f"""
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained({ckpt!r}); m = AutoModelForCausalLM.from_pretrained({ckpt!r})
ids = tok.apply_chat_template([{{"role": "user", "content": "What is 2 + 3?"}}], add_generation_prompt=True)
from vllm import LLM, SamplingParams
llm = LLM(model={ckpt!r}, dtype="float32", enforce_eager=True, max_model_len=256)
out = llm.generate([{{"prompt_token_ids": list(ids["input_ids"] if hasattr(ids, "keys") else ids)}}],
                   SamplingParams(max_tokens=8, temperature=0))
print("GEN", len(out[0].outputs[0].token_ids))
"""
    env = dict(child_env(), VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "GEN " in r.stdout, r.stderr[-3000:]
    assert int(r.stdout.split("GEN ")[1].split()[0]) > 0


@pytest.mark.slow
def test_probe_catches_a_skipped_sync(tmp_path):
    """With the weight push skipped, the engine serves the old weights and the probe must stop the run."""
    r = torchrun(
        [
            "--preset",
            "smoke",
            "--precision",
            "fp32",
            "--steps",
            "2",
            "--log.run-dir",
            str(tmp_path / "stale"),
            "--debug.skip-sync",
        ],
        retry_abort=False,
    )
    assert r.returncode != 0
    # the build sync pushed (and calibrated the tolerance); the first skipped push is caught at once
    assert "stale weights" in r.stderr and "after sync to version 1" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize(
    "args, field",
    [
        (["--rollout.group-size", "1"], "--rollout.group-size"),  # the flags as the user types them
        (["--optim.lr", "-1"], "--optim.lr"),
        (["--env", "nope"], "--env"),
        (["--algorithm.clip-low", "-0.1"], "--algorithm.clip-low"),
        (["--engine.max-model-len", "4"], "--engine.max-model-len"),
        (["--algorithm.loss-agg-mode", "token-meen"], "--algorithm.loss-agg-mode"),
        (["--algorithm.policy-loss", "ppo2"], "cispo, gspo, nll, ppo, sapo"),  # the registered names
        (["--algo", "grpoo"], "--algo"),
    ],
)
def test_bad_config_fails_at_startup_naming_the_field(args, field, capsys):
    from nanosky.cli import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(args, console=True)
    out = capsys.readouterr()
    assert field in out.err + out.out + str(e.value)


def test_algo_preset_and_overrides():
    from nanosky.cli import parse_args

    cfg = parse_args(["--algo", "dapo", "--algorithm.clip-high", "0.3", "--rollout.group-size", "4"], console=False)
    assert cfg.algorithm.name == "dapo" and cfg.algorithm.dynamic_sampling and cfg.algorithm.clip_high == 0.3
    assert cfg.rollout.group_size == 4
    assert parse_args(["--algo", "sapo"], console=False).algorithm.policy_loss == "sapo"


def test_help_documents_every_flag():
    r = subprocess.run([sys.executable, "run.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    for flag in (
        "--algo",
        "--env",
        "--rollout.group-size",
        "--algorithm.clip-high",
        "--engine.kv-cache-gib",
        "--optim.micro-batch-size",
        "--optim.micro-batch-tokens",
        "--optim.packing",
        "--rollout.step-weight",
        "--eval.every",
        "--debug.skip-sync",
    ):
        assert flag in r.stdout, flag
    assert "Samples per prompt" in r.stdout  # field docstrings become help text


@pytest.mark.slow
def test_one_failing_rank_stops_the_whole_job_promptly(tmp_path):
    """Rank 1 raises at step 2 while rank 0 waits in a collective: the job must exit non-zero within seconds, not
    at the collective timeout."""
    import time

    t0 = time.time()
    r = torchrun(
        [
            "--preset",
            "smoke",
            "--steps",
            "4",
            "--log.run-dir",
            str(tmp_path / "fail"),
            "--debug.fail-rank",
            "1",
            "--debug.fail-step",
            "2",
            "--dist.timeout-s",
            "600",
        ],
        retry_abort=False,
        launcher="torchrun",  # how torchrun ends a job when one rank fails
    )
    wall = time.time() - t0
    assert r.returncode != 0
    assert "injected failure on rank 1 at step 2" in r.stderr
    print(f"fail-fast: job exited {wall:.1f} s after launch")
    assert wall < 240, wall  # start-up (~60 s) + 1 step, nowhere near the 600 s collective timeout


def test_agent_env_without_preset_starts_from_its_preset():
    """`run.py --algo grpo --env tool_use` gets the tool model and budgets; --algo and explicit flags still win."""
    from nanosky.cli import parse_args

    cfg = parse_args(["--algo", "grpo", "--env", "tool_use"], console=False)
    assert cfg.env == "tool_use" and cfg.model.path == "tiny-tool" and cfg.algorithm.name == "grpo"
    assert cfg.algorithm.adv_estimator == "grpo"
    assert parse_args(["--env=alfworld_lite"], console=False).engine.max_model_len == 768
    swe = parse_args(["--env", "swe"], console=False)
    assert swe.model.path == "tiny-swe" and swe.env_kwargs["test_suite"] == "generated"
    assert parse_args(["--env", "tool_use", "--model.path", "x"], console=False).model.path == "x"
    assert parse_args(["--preset", "default", "--env", "tool_use"], console=False).model.path == "tiny"
    assert parse_args(["--env", "math"], console=False).model.path == "tiny"
