"""Step-wise samples (nanosky/agent/window.py, nanosky/train/stepwise.py): the history window, rows with exact sampled ids, the episode view that
gives every step its episode's advantage, padding rows that the loss does not count."""

import asyncio

import pytest
import torch

import algos
import envs
from nanosky.agent import AgentRunner, EnvTask, GenerationResult, Request
from nanosky.agent.trajectory import Step, Trajectory
from nanosky.agent.window import window
from nanosky.rollout.chat import encode, prompt_ids
from nanosky.train.batch import to_batch
from nanosky.train.stepwise import advantages, assign_advantages, samples, split_rows
from nanosky.train.update import OptimConfig, minibatches

SYS, TASK = {"role": "system", "content": "s"}, {"role": "user", "content": "task"}


def _conv(n: int) -> list[dict]:
    out = [SYS, TASK]
    for k in range(1, n + 1):
        out += [{"role": "assistant", "content": f"a{k}"}, {"role": "user", "content": f"o{k}"}]
    return out


def test_window_keeps_the_opening_and_the_last_k_turns():
    assert window(_conv(2), 2) == _conv(2) and window(_conv(0), 1) == _conv(0)
    w = window(_conv(4), 2)
    assert w[0] == SYS and w[1]["content"] == "task\n\n[2 earlier steps not shown]"
    assert [m["content"] for m in w[2:]] == ["a3", "o3", "a4", "o4"]
    assert window(_conv(2), 1)[1]["content"].endswith("[1 earlier step not shown]")
    tool_turns = _conv(1) + [{"role": "assistant", "content": "a2"}, {"role": "tool", "content": "t"}, TASK]
    assert [m["content"] for m in window(tool_turns, 1)[2:]] == [
        "a2",
        "t",
        "task",
    ]  # a turn keeps all its replies
    assert _conv(4)[1]["content"] == "task"  # the caller's messages are not modified


def test_window_shows_only_the_current_admissible_actions():
    """Past observations lose their `show_actions` list (stale: a small model copies from it); the current one and
    the hidden-steps note stay."""
    from envs.base import admissible_actions_text

    def obs(text, acts):
        return {"role": "user", "content": text + admissible_actions_text(acts)}

    conv = [SYS, obs("room", ["go to a 1", "look"])]
    assert window(conv, 2) == conv  # the first step: its list is current
    conv += [{"role": "assistant", "content": "go to a 1"}, obs("at a 1", ["take x 1 from a 1"])]
    conv += [{"role": "assistant", "content": "take x 1 from a 1"}, obs("holding x 1", ["go to b 1"])]
    w = window(conv, 1)
    assert w[1]["content"] == "room\n\n[1 earlier step not shown]"
    assert [m["content"] for m in w[2:]] == ["take x 1 from a 1", conv[-1]["content"]]
    assert [m["content"] for m in window(conv, 2)[1:4]] == ["room", "go to a 1", "at a 1"]
    assert "admissible" in conv[1]["content"]  # the caller's messages are not modified


class IdsBackend:
    """Scripted alfworld commands with token ids and fake logprobs, recording each request's prompt ids."""

    def __init__(self, tok, actions: list[str]):
        self.tok, self.actions, self.prompts = tok, actions, []

    async def aclose(self) -> None:
        pass

    async def generate(self, req: Request) -> GenerationResult:
        k = len(self.prompts)  # one episode: the k-th request is turn k
        self.prompts.append((list(req.messages), list(req.prompt_ids)))
        ids = encode(self.tok, self.actions[k]) + [self.tok.eos_token_id]
        await asyncio.sleep(0)
        return GenerationResult(self.actions[k], ids, [-0.1 * (j + 1) for j in range(len(ids))], "stop", 0, len(ids))


def test_runner_samples_each_turn_from_its_window_and_keeps_the_sampled_ids(tok):
    env = envs.make("alfworld_lite", split="test", seed=2)
    actions = ["look", "inventory", f"go to {env.layout.receptacles[0]}", "look"]
    backend = IdsBackend(tok, actions)
    [t] = AgentRunner(backend, tok=tok, max_turns=4, history_window=1).run([EnvTask.make("alfworld_lite", "test", 2)])
    assert t.turns == 4 and len(t.steps) == 4 and t.stop_reason == "max_turns"
    for k, (step, (shown, ids)) in enumerate(zip(t.steps, backend.prompts)):
        history = t.messages[: 2 + 2 * k]  # opening + k (action, observation) pairs
        assert shown == window(history, 1) and step.prompt_ids == ids == prompt_ids(tok, shown)
        assert step.ids == encode(tok, actions[k]) + [tok.eos_token_id]  # exactly what the backend sampled
        assert step.logprobs == [-0.1 * (j + 1) for j in range(len(step.ids))]
    assert "earlier step not shown" in backend.prompts[2][0][1]["content"]
    # the concatenated record is still there for the logs: every sampled id, in order, under mask 1
    assert [i for i, m in zip(t.ids, t.loss_mask) if m] == [i for s in t.steps for i in s.ids]


def _episode(group: int, rewards: list[float], reward: float, keys: list) -> Trajectory:
    steps = [Step([1, 2, 3 + k], [10 + k, 11], [-0.5, -0.25]) for k in range(len(keys))]
    return Trajectory(reward=reward, turn_rewards=rewards, state_keys=keys, steps=steps, group=group, turns=len(keys))


def test_samples_are_one_row_per_step_with_their_bookkeeping():
    trajs = [_episode(0, [0.0, 0.5], 1.0, ["A", "B"]), _episode(0, [0.0], 0.0, ["A"])]
    rows = samples(trajs)
    assert [(r.info["episode"], r.info["step"]) for r in rows] == [(0, 0), (0, 1), (1, 0)]
    r = rows[1]
    assert r.ids == [1, 2, 4, 11, 11] and r.loss_mask == [0, 0, 0, 1, 1] and r.logprobs == [0, 0, 0, -0.5, -0.25]
    assert r.prompt_len == 3 and r.reward == 1.0 and r.group == 0 and r.state_keys == ["B"]
    assert [x.turn_rewards[0] for x in rows] == [0.0, 1.0, 0.0]  # the verdict's remainder on the last step


def test_every_step_gets_its_episodes_advantage():
    # Group 0: a 3-step success and a 1-step failure; group 1: two 2-step episodes. GRPO over episodes, not steps.
    trajs = [
        _episode(0, [0.0, 0.0, 1.0], 1.0, ["A", "B", "C"]),
        _episode(0, [0.0], 0.0, ["A"]),
        _episode(1, [0.0, 0.0], 0.5, ["A", "B"]),
        _episode(1, [0.0, 0.0], 0.0, ["A", "C"]),
    ]
    rows = samples(trajs)
    cfg = algos.preset("grpo")
    per_episode, _ = algos.get_adv_estimator("grpo")(
        torch.tensor([[1.0], [0.0], [0.5], [0.0]]), torch.ones(4, 1), torch.tensor([0, 0, 1, 1])
    )
    want = torch.stack([per_episode[r.info["episode"], 0] for r in rows])
    torch.testing.assert_close(advantages(trajs, rows, cfg), want)
    # GiGPO on the rows equals GiGPO on the steps (the public function).
    g = algos.preset("gigpo")
    direct = algos.gigpo_advantages(
        torch.tensor([r.turn_rewards[0] for r in rows], dtype=torch.float64),
        torch.tensor([r.info["episode"] for r in rows]),
        torch.tensor([r.info["step"] for r in rows]),
        torch.tensor([r.group for r in rows]),
        [r.state_keys[0] for r in rows],
        gamma=g.gamma,
    )
    torch.testing.assert_close(advantages(trajs, rows, g).double(), direct, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="critic"):
        advantages(trajs, rows, algos.preset("ppo"))


def test_episode_weight_gives_every_episode_the_same_total_weight():
    """--rollout.step-weight episode: a row's advantage is scaled by S_mean / S_i, so a long failure no longer
    outweighs a short success by its length; step (the default) leaves the advantages as they are."""
    trajs = [
        _episode(0, [0.0, 1.0], 1.0, ["A", "B"]),  # a 2-step success
        _episode(0, [0.0] * 6, 0.0, list("ACDEFG")),  # a 6-step failure
    ]
    rows = samples(trajs)
    cfg = algos.preset("grpo")
    plain = advantages(trajs, rows, cfg)
    assert torch.equal(advantages(trajs, rows, cfg, weight="step"), plain)
    weighted = advantages(trajs, rows, cfg, weight="episode")
    w = torch.tensor([4 / 2] * 2 + [4 / 6] * 6)  # S_mean = 4
    torch.testing.assert_close(weighted, plain * w)
    per_episode = [float(weighted[[r.info["episode"] == e for r in rows]].sum()) for e in (0, 1)]
    assert per_episode[0] == pytest.approx(-per_episode[1])  # equal and opposite, 2 steps against 6
    assert float(plain[:2].sum()) == pytest.approx(-float(plain[2:].sum()) / 3)  # unweighted: 3 to 1
    with pytest.raises(ValueError, match="step weight"):
        advantages(trajs, rows, cfg, weight="token")


def test_split_rows_pads_evenly_and_covers_every_row_once():
    rows = samples([_episode(0, [0.0] * 5, 0.0, list("ABCDE"))])
    parts = split_rows(rows, 2)
    assert [len(p) for p in parts] == [3, 3] and sum(p.count(None) for p in parts) == 1
    assert sorted(j for p in parts for j in p if j is not None) == list(range(5))


def test_padding_rows_get_no_advantage_and_are_not_counted(dist_info):
    trajs = [_episode(0, [0.0, 0.0], 1.0, ["A", "B"]), _episode(0, [0.0], 0.0, ["A"])]
    rows = samples(trajs)
    mine = [0, None, 1, 2]
    batch = to_batch([None if j is None else rows[j] for j in mine], 0, "cpu")
    assert batch.row_mask.tolist() == [1.0, 0.0, 1.0, 1.0] and batch.loss_mask[1].sum() == 0
    assign_advantages(batch, trajs, rows, mine, algos.preset("grpo"))
    assert batch.advantages[1].abs().sum() == 0
    assert batch.advantages[0][batch.loss_mask[0] > 0].unique().tolist() == pytest.approx([0.7071], abs=1e-3)
    # seq-mean-token-mean over the 3 samples: the same loss with or without the padding row
    cfg = algos.AlgoConfig(loss_agg_mode="seq-mean-token-mean")
    plain = to_batch(rows, 0, "cpu")
    loss = torch.arange(1.0, 1.0 + plain.loss_mask.numel()).reshape(plain.loss_mask.shape)  # [3, T]
    padded_loss = torch.cat([loss[:1], torch.full_like(loss[:1], 1e6), loss[1:]])  # [4, T]
    totals = []
    for b, x in ((batch, padded_loss), (plain, loss)):
        [[(micro, scale)]] = list(minibatches(b, cfg, OptimConfig(micro_batch_size=8)))
        totals.append(float(algos.agg_loss(x, micro.loss_mask, cfg.loss_agg_mode)) * scale)
    assert totals[0] == pytest.approx(totals[1])
