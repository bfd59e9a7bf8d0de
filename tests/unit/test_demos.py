"""SFT's player (nanosky/agent/demos.py): the env's own expert plays each training episode through nanosky's loop,
so a demonstration renders, tokenises and masks as an RL episode of the same env: only the assistant's tokens (each
turn's end-of-turn token included) are trained, the opening and the observations are not."""

import asyncio

import pytest

import envs
from nanosky.agent import AgentRunner, EnvTask, PooledEnvTask
from nanosky.agent.demos import Demonstrator
from nanosky.agent.task import EnvError
from nanosky.bundled import resolve_model_path
from nanosky.rollout.chat import encode, load_tokenizer
from nanosky.rollout.envpool import make_pool


class NoEngine:
    """The engine must never be asked: every reply is the expert's."""

    async def generate(self, req):
        raise AssertionError("a demonstration sampled from the engine")

    async def aclose(self):
        pass


def _play(tasks, tok, **kw):
    player = Demonstrator(AgentRunner(NoEngine(), tok=tok, max_total_tokens=2048, **kw))
    return asyncio.run(player.play(tasks, groups=list(range(len(tasks))), seeds=list(range(len(tasks)))))


def _trained_runs(t) -> list[list[int]]:
    """The trajectory's ids at mask 1, as their contiguous runs (one per assistant turn)."""
    runs, cur = [], []
    for i, m in zip(t.ids, t.loss_mask):
        if m:
            cur.append(i)
        elif cur:
            runs, cur = runs + [cur], []
    return runs + ([cur] if cur else [])


@pytest.mark.parametrize("env, turns", [("math", 1), ("alfworld_lite", 3)])
def test_a_demonstration_trains_exactly_the_experts_replies(env, turns):
    tok = load_tokenizer(resolve_model_path("tiny-agent"))
    pool = make_pool(1)
    try:
        out = _play([PooledEnvTask(pool, env, "train", seed=s) for s in (0, 1)], tok)
    finally:
        pool.shutdown()
    assert out.layout == "concat" and len(out.trajs) == 2
    for s, t in enumerate(out.trajs):
        expert = envs.make(env, "train", seed=s)
        opening = expert.reset()
        replies = []
        while True:  # the expert's episode, played again beside the demonstration
            replies.append(expert.expert_action())
            res = expert.step(replies[-1])
            if res.done:
                break
        assert t.stop_reason == "done" and t.success and t.reward > 0, (t.stop_reason, t.error)
        assert [m["content"] for m in t.messages if m["role"] == "assistant"] == replies and t.turns >= turns
        assert t.messages[: len(opening)] == opening
        # mask 1 exactly on each reply's tokens and its end-of-turn token; the opening and observations at 0
        assert _trained_runs(t) == [encode(tok, r) + [tok.eos_token_id] for r in replies]
        assert t.loss_mask[: t.prompt_len] == [0] * t.prompt_len  # the opening is never trained
        assert turns == 1 or 0 in t.loss_mask[t.prompt_len :]  # multi-turn: the observations between turns neither


def test_a_held_out_task_is_never_demonstrated_and_a_task_without_an_expert_is_an_env_error():
    tok = load_tokenizer(resolve_model_path("tiny"))
    [t] = _play([EnvTask.make("math", "test", seed=0)], tok).trajs
    assert t.stop_reason == "env_error" and "test split" in t.error and not any(t.loss_mask)

    class NoExpert(EnvTask):
        async def expert_action(self):
            raise EnvError("no expert here")

    [t] = _play([NoExpert(envs.make("math", "train", seed=0))], tok).trajs
    assert t.stop_reason == "env_error" and "no expert" in t.error
    assert (
        not envs.has_expert("reasoning_gym")
        and envs.has_expert("tool_use")
        and envs.has_expert("math")
        and envs.has_expert("alfworld_lite")
    )


def test_a_dataset_rows_solution_is_demonstrated_through_the_loop_with_only_its_tokens_trained(tmp_path):
    """`--algo sft --env dataset`: a file's solution column is the demonstration, rendered and masked as the RL
    episode of the same row would be (the prompt at mask 0, the solution and its end-of-turn token at mask 1)."""
    import json

    rows = [{"prompt": f"What is {i} + 2?", "completion": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in range(8)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = load_tokenizer(resolve_model_path("tiny"))
    out = _play([EnvTask.make("dataset", "train", seed=s, data_path=str(path)) for s in (0, 1)], tok)
    for s, t in enumerate(out.trajs):
        env = envs.make("dataset", "train", seed=s, data_path=str(path))
        assert t.stop_reason == "done" and t.reward == 1.0, (t.stop_reason, t.error)  # math-verify on the gold
        assert t.messages[:-1] == env.reset() and t.messages[-1]["content"] == env.task.solution
        assert _trained_runs(t) == [encode(tok, env.task.solution) + [tok.eos_token_id]]
        assert t.loss_mask[: t.prompt_len] == [0] * t.prompt_len


def test_an_expert_move_the_env_does_not_list_is_trained_without_the_choices_mask():
    """With constrained actions each demonstrated turn keeps the env's choices as its mask, except a move those
    choices do not list: webshop_lite's expert, failing to find the product in 5 pages, searches its title (train
    seed 74407), a search the policy is never offered. That turn trains unconstrained; before, its mask refused the
    expert's own tokens and stopped the run."""
    tok = load_tokenizer(resolve_model_path("tiny-agent"))
    kw = {"show_actions": True, "invalid_penalty": 0.0, "page_size": 3}
    [t] = _play([EnvTask.make("webshop_lite", "train", seed=74407, **kw)], tok, constrain_actions=True).trajs
    assert t.stop_reason == "done" and t.success, (t.stop_reason, t.error)
    replies = [m["content"] for m in t.messages if m["role"] == "assistant"]
    off = [i for i, r in enumerate(replies) if r.startswith("search[") and i > 0]
    assert off and replies[off[0]] == "search[calloway storage shelves solid wood desk]"
    starts = [s for s, _ in t.constraints]
    turn_starts = [s for s, run in _turn_starts(t)]
    assert len(turn_starts) == len(replies) and starts == [s for i, s in enumerate(turn_starts) if i not in off]
    for s, rule in t.constraints:  # every kept mask allows its turn's move
        assert replies[turn_starts.index(s)] in rule


def _turn_starts(t) -> list[tuple[int, int]]:
    """(start, length) of each contiguous run of trained ids."""
    out, k = [], 0
    while k < len(t.loss_mask):
        if t.loss_mask[k]:
            n = 0
            while k + n < len(t.loss_mask) and t.loss_mask[k + n]:
                n += 1
            out.append((k, n))
            k += n
        else:
            k += 1
    return out


def test_an_sft_run_is_built_with_the_demonstrator_for_training_and_the_policy_for_its_evals(tmp_path):
    """The run's players are chosen once (`collect.players`): SFT trains on the expert and evaluates the policy; RL
    plays both with one. `--algo sft` sets one episode a prompt itself and refuses another group size, never
    rewriting the user's flag."""
    from nanosky import dist
    from nanosky.cli import parse_args
    from nanosky.collect import players
    from nanosky.preflight import UsageError

    dist.init_distributed()
    tok = load_tokenizer(resolve_model_path("tiny"))
    run = ["--preset", "smoke", "--log.run-dir", str(tmp_path)]
    sft = parse_args([*run, "--algo", "sft"], console=False)
    assert sft.rollout.group_size == 1  # the smoke preset's 4 is the preset's, not the user's
    train, heldout = players(sft, NoEngine(), tok)
    assert isinstance(train, Demonstrator) and isinstance(heldout, AgentRunner)
    rl = parse_args(run, console=False)
    train, heldout = players(rl, NoEngine(), tok)
    assert train is heldout and isinstance(train, AgentRunner) and rl.rollout.group_size == 4
    with pytest.raises(UsageError, match=r"--rollout.group-size must be 1 with demonstrations \(--algo sft\), got 4"):
        parse_args([*run, "--algo", "sft", "--rollout.group-size", "4"], console=False)


class CountingNoEngine(NoEngine):
    """NoEngine with the counters a Rollout reads (`Rollout._counters`)."""

    busy_s, engine_steps, batched, version = 0.0, 0, 0, 0


def test_train_tasks_folds_training_prompts_onto_n_fixed_tasks_and_leaves_held_out_splits_alone():
    """`--rollout.train-tasks N`: every training episode is one of the tasks of env seeds 0..N-1 (the data-limited
    regime: SFT on N demonstrations); an eval's seeds are untouched."""
    from nanosky import dist
    from nanosky.collect import Rollout
    from nanosky.config import RolloutConfig

    dist.init_distributed()
    tok = load_tokenizer(resolve_model_path("tiny-agent"))
    fixed = {envs.make("tool_use", "train", seed=s).reset()[-1]["content"] for s in range(3)}
    pool = make_pool(1)
    try:
        demos = Demonstrator(AgentRunner(NoEngine(), tok=tok, max_total_tokens=2048))
        rollout = Rollout(RolloutConfig(train_tasks=3), CountingNoEngine(), pool, tok, player=demos)
        seeds = list(range(1000, 1012))
        out = rollout.run("tool_use", {}, "train", seeds, version=0, groups=list(range(12)))
        asked = [t.messages[1]["content"] for t in out.trajs]
        assert set(asked) <= fixed and len(set(asked)) > 1 and all(t.success for t in out.trajs)
        assert rollout.task_seed("train", 1001) == 1001 % 3
        assert rollout.task_seed("validation", 1001) == rollout.task_seed("test", 1001) == 1001
        unlimited = Rollout(RolloutConfig(), CountingNoEngine(), pool, tok, player=demos)
        out = unlimited.run("tool_use", {}, "train", seeds, version=0, groups=list(range(12)))
        assert len({t.messages[1]["content"] for t in out.trajs} - fixed) > 3
    finally:
        pool.shutdown()
    with pytest.raises(ValueError, match="train_tasks must be >= 1"):
        RolloutConfig(train_tasks=0)
