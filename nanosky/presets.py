"""Presets: Python functions returning a `TrainConfig` (`--preset NAME`; `--env NAME` alone picks the env's).

Each preset's numbers come from measured runs; the comments say which, and `docs/experiments/` has the runs.
"""

from __future__ import annotations

import json

import algos
from nanosky.config import (
    EngineConfig,
    EnvPoolConfig,
    EvalConfig,
    LogConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    TrainConfig,
)


def demo() -> TrainConfig:
    """`make demo`: GRPO on text_math's logic problems with the bundled tiny model, 2 CPU ranks (~5 minutes).

    The logic subset because the 3.4M-parameter warm start has real signal there (≈23 % held-out) but almost none
    on multi-digit arithmetic yet (docs/experiments/text_math.md); `--env-kwargs kinds '["arith","word","logic"]' --eval.limit 200`
    trains on the full mix."""
    return TrainConfig(
        env="math",
        env_kwargs={"kinds": '["logic"]'},
        steps=40,
        rollout=RolloutConfig(group_size=8, prompts_per_step=32, max_new_tokens=48, max_total_tokens=160),
        optim=OptimConfig(lr=5e-4, micro_batch_size=32),
        eval=EvalConfig(every=10, limit=66, n_samples=4),  # the 66 held-out logic problems, 4 samples each
        log=LogConfig(run_dir="runs/demo-{algo}", ckpt_every=20),
    )


def smoke() -> TrainConfig:
    """A few fast steps (tests, CI). Its KV cache is a quarter GiB a rank: 16 sequences of 160 tokens and the
    evals' 16 need ~10 MiB of the tiny model's (4 KiB a token in fp32), and each GiB costs ~1.3 s of every start."""
    return TrainConfig(
        steps=3,
        engine=EngineConfig(kv_cache_gib=0.25),
        rollout=RolloutConfig(group_size=4, prompts_per_step=8, max_new_tokens=32, max_total_tokens=160),
        optim=OptimConfig(lr=5e-4, micro_batch_size=16),
        eval=EvalConfig(every=0, limit=16, n_samples=1),
        log=LogConfig(ckpt_every=2, tqdm=False),
    )


def smollm2_logic() -> TrainConfig:
    """GRPO on text_math's logic problems (`make demo`'s task) with a real pretrained model, SmolLM2-135M-Instruct
    from the PyPI wheel's GGUF (`--model.path smollm2-135m`), full fine-tuning.

    The model's own answer format ("The answer is: N", else the last number: `answer_format last`): it ignores
    `<answer>` tags and rarely writes `####`. Zero-shot it rarely names one of the options (asked "Which is larger,
    12 or 11?" it talks about common divisors). Sampled at T = 0.7 (the held-out evals too): at T = 1 the 135M model
    rambles off its format. 64 new tokens: its replies run to ~80, and the budget is part of what it learns. lr 2e-5:
    at 5e-6, where RL recipes for pretrained models of this size sit, 20 steps on word and logic problems did not
    move it. Most of the gain is answering with one of the options, which a guess already scores 0.444 on; the runs
    and their numbers: docs/experiments/real_model.md."""
    return TrainConfig(
        env="math",
        env_kwargs={"answer_format": "last", "kinds": '["logic"]'},
        model=ModelConfig(path="smollm2-135m"),
        steps=30,
        rollout=RolloutConfig(
            group_size=8, prompts_per_step=8, max_new_tokens=64, max_total_tokens=256, temperature=0.7
        ),
        optim=OptimConfig(lr=2e-5, micro_batch_size=16),
        eval=EvalConfig(every=10, limit=66, n_samples=4, temperature=0.7),  # the 66 held-out logic problems
        log=LogConfig(run_dir="runs/smollm2_logic-{algo}", ckpt_every=0),
    )


SMOLLM2_ARITH_TASKS = {  # reasoning-gym configs where SmolLM2-135M's lenient held-out accuracy is 10-30 %
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "max_digits": 2,
        "operators": ["+", "-", "*"],
        "allow_parentheses": False,
        "allow_negation": False,
    },
    "chain_sum": {"min_terms": 2, "max_terms": 3, "max_digits": 2},
    "letter_counting": {"min_words": 3, "max_words": 6},  # held-out only (weight 0): does the run keep it?
    "products": {"max_digits": 2},  # held-out only (weight 0)
}


def smollm2_arith() -> TrainConfig:
    """`make demo-real`: GRPO on reasoning-gym's small sums (basic_arithmetic: 2 terms of 1-2 digits, + - ×;
    chain_sum: 2-3 terms) with SmolLM2-135M-Instruct, full fine-tuning (needs the `gyms` extra, which `make` installs:
    `pip install -e '.[gyms]'`).

    Open answers (chance ~0), scored however the reply states them (`answer_format last`: the reward is the lenient
    score, so the run learns the sums, not a format). The held-out split has 50 questions per task, letter_counting
    and products among them at weight 0: never trained on, they show what the run keeps. 20 steps, chosen on the
    validation split (the eval split here; `--eval.split test` for the final figure only); T = 0.7 and lr 2e-5 as
    `smollm2_logic`. Runs and numbers: docs/experiments/real_model.md."""
    return TrainConfig(
        env="reasoning_gym",
        env_kwargs={
            "tasks": ",".join(SMOLLM2_ARITH_TASKS),
            "weights": "1,1,0,0",
            "config": json.dumps(SMOLLM2_ARITH_TASKS),
            "answer_format": "last",
            "test_size": 50,
        },
        model=ModelConfig(path="smollm2-135m"),
        steps=20,
        rollout=RolloutConfig(
            group_size=8, prompts_per_step=8, max_new_tokens=128, max_total_tokens=384, temperature=0.7
        ),
        optim=OptimConfig(lr=2e-5, micro_batch_size=16),
        # every held-out question: 4 tasks x 50, interleaved (seed k is task k % 4, item k // 4)
        eval=EvalConfig(every=10, limit=200, n_samples=2, temperature=0.7, split="validation"),
        log=LogConfig(run_dir="runs/smollm2_arith-{algo}", ckpt_every=0),
    )


def bench() -> TrainConfig:
    """`make bench`: 32 prompts × 8 samples × 32 new tokens."""
    return TrainConfig(
        steps=6,
        rollout=RolloutConfig(group_size=8, prompts_per_step=32, max_new_tokens=32, max_total_tokens=160),
        optim=OptimConfig(lr=5e-4, micro_batch_size=64),
        eval=EvalConfig(every=0, limit=8, n_samples=1),
        log=LogConfig(run_dir="runs/bench-{algo}", tqdm=False),
    )


def compare() -> TrainConfig:
    """`make compare`: the same short budget for every --algo preset (bench/compare_algos.py)."""
    return TrainConfig(
        steps=15,
        rollout=RolloutConfig(group_size=8, prompts_per_step=16, max_new_tokens=48, max_total_tokens=160),
        optim=OptimConfig(lr=5e-4, micro_batch_size=32),
        eval=EvalConfig(every=0, limit=200, n_samples=1),
        log=LogConfig(ckpt_every=0, tqdm=False),
    )


def tool_use() -> TrainConfig:
    """Dr. GRPO on the tool_use env (calculator / python_exec tasks), multi-turn, the bundled tool model.

    arith + python only: the train split's wiki / search questions name entities the model saw in its demonstrations,
    so on train they are answered from memory, not with the tools. 80 steps: held-out accuracy still rose at step 80
    in both seeds run. Dr. GRPO, not GRPO: std normalisation turns the 0.1 format term into a full-size signal in
    groups with no correct answer. lr 5e-5: at 1e-4 and above the policy got worse within 10 steps
    (docs/experiments/tool_use.md)."""
    return TrainConfig(
        algorithm=algos.preset("dr_grpo"),
        env="tool_use",
        env_kwargs={"kinds": '["arith", "python"]'},
        model=ModelConfig(path="tiny-tool"),
        steps=80,  # ~12 s per step on the 2-core box: ~20 minutes with the evals (docs/experiments/tool_use.md)
        rollout=RolloutConfig(group_size=8, prompts_per_step=32, max_new_tokens=64, max_total_tokens=480),
        envpool=EnvPoolConfig(workers=2, step_timeout_s=60.0),
        optim=OptimConfig(lr=5e-5, micro_batch_size=16),
        # limit 200 = every held-out task of the two kinds (100), 4 samples each
        eval=EvalConfig(every=10, limit=200, n_samples=4),
        log=LogConfig(run_dir="runs/tool_use-{algo}", ckpt_every=0),
    )


def agent_env(env: str) -> TrainConfig:
    """A multi-step text env (webshop_lite / alfworld_lite) the way verl-agent runs ALFWorld: step-wise samples with a
    2-turn history, the admissible actions in each observation, the bundled agent model (trained on exactly these
    prompts; webshop_lite with 3 results per page, as in its demonstrations), each turn sampled from the admissible
    actions only (`--rollout.no-constrain-actions` samples freely). GRPO; `--algo gigpo` adds step-level credit from
    repeated states."""
    # alfworld_lite in rooms of 3-5 receptacles (default 6-10): the agent model succeeds in 13 % of those episodes
    # at T = 1 against 5 % in full rooms, where GRPO's groups were nearly all failures
    # (docs/experiments/alfworld_lite.md)
    # invalid_penalty 0 (verl-agent uses 0.1): with it, a loop of valid moves out-earns exploring, and at lr 3e-4
    # the policy fell into such loops within 5 steps (docs/experiments/alfworld_lite.md)
    kwargs = {"show_actions": "true", "invalid_penalty": "0"} | (
        {"page_size": "3"}
        if env == "webshop_lite"
        else {"n_receptacles": "[3, 5]", "progress_reward": "0", "test_set": "unseen"}
    )
    return TrainConfig(
        env=env,
        env_kwargs=kwargs,
        model=ModelConfig(path="tiny-agent"),
        engine=EngineConfig(max_model_len=768),
        # the measured runs (docs/experiments/{webshop_lite,alfworld_lite}.md): 20 steps of 8 tasks x 8 episodes,
        # ~10 (webshop_lite) to ~22 (alfworld_lite) minutes on the 2-core box with the evals
        steps=20,
        # 64 new tokens on webshop: search[...] repeats the instruction (~40 tokens); a turn cut off without its
        # end-of-turn token ends the episode. alfworld's commands are under 16 tokens.
        rollout=RolloutConfig(
            group_size=8,
            prompts_per_step=8,
            max_new_tokens=64 if env == "webshop_lite" else 24,
            max_total_tokens=768,
            mode="stepwise",
            history_window=2,
            # sample only admissible actions (nanosky/train/constrain.py): held-out success at the start 0.00 -> 0.08
            # (webshop_lite) and 0.145 -> 0.26 (alfworld_lite), 200 episodes each
            # (docs/experiments/{webshop_lite,alfworld_lite}.md)
            constrain_actions=True,
        ),
        # lr 1e-4 with constrained actions (the measured runs); sampling freely, at 2e-4 both grpo and gigpo fell
        # into loops within 7 steps (docs/experiments/alfworld_lite.md).
        # Micro-batches by tokens: sorted, so a group's turns (one system prompt and task) are packed together.
        # 768 (one packed row): a 14 % faster train phase than 4,096 in rows of 1,024 (bench/train_phase.py)
        optim=OptimConfig(lr=1e-4, micro_batch_tokens=768),
        # 200 held-out episodes: the standard error of a success rate near 0.1 is ~0.02
        eval=EvalConfig(every=10, limit=200, n_samples=1),
        log=LogConfig(run_dir=f"runs/{env}-{{algo}}", ckpt_every=0),
    )


def swe() -> TrainConfig:
    """GRPO on generated bug-fix tasks (`--env swe`, level 1), multi-turn with the bash / str_replace_editor /
    submit tools, from the bundled `tiny-swe` (trained on the expert's episodes), each turn sampled as one valid call
    (`--rollout.no-constrain-actions` samples freely). Evals run on held-out generated
    bugs (`test_suite generated`); `python -m evals.swebench --ckpt` runs the shipped suite. A turn's tools, the
    test runs and the grading at submit run in the env pools, concurrently (`envs/step_latency_s`, `envs/step_share`
    say what they cost)."""
    return TrainConfig(
        env="swe",
        env_kwargs={"level": "1", "test_suite": "generated", "max_turns": "6"},
        model=ModelConfig(path="tiny-swe"),
        engine=EngineConfig(max_model_len=1536),
        steps=20,
        # an expert episode is ~850 tokens; a str_replace call with a 4-line old_str ~120
        # each turn one well-formed call whose paths and old_str exist (env kwargs constrain_paths /
        # constrain_old_str): held-out level-1 resolve rate at the start 0.04 -> 0.32 (docs/experiments/swe.md);
        # `--rollout.no-constrain-actions --optim.lr 5e-5` gives the earlier free-sampling preset
        rollout=RolloutConfig(
            group_size=8,
            prompts_per_step=4,
            max_new_tokens=160,
            max_total_tokens=1536,
            constrain_actions=True,
        ),
        envpool=EnvPoolConfig(workers=2, step_timeout_s=180.0),
        optim=OptimConfig(lr=1e-4, micro_batch_tokens=8192),
        eval=EvalConfig(every=5, limit=50, n_samples=1),
        log=LogConfig(run_dir="runs/swe-{algo}", ckpt_every=0),
    )


ENV_PRESETS = ("tool_use", "webshop_lite", "alfworld_lite", "swe")
"""Envs whose preset is the base config when `--env` is given without `--preset`."""

PRESETS = {
    "default": TrainConfig,
    "demo": demo,
    "smoke": smoke,
    "smollm2_logic": smollm2_logic,
    "smollm2_arith": smollm2_arith,
    "bench": bench,
    "compare": compare,
    "tool_use": tool_use,
    "webshop_lite": lambda: agent_env("webshop_lite"),
    "alfworld_lite": lambda: agent_env("alfworld_lite"),
    "swe": swe,
}
