"""An external agent's episodes as training rows (nanosky/endpoint/rows.py): one segment is one concatenated row
whose calls are GiGPO's steps; an episode of several segments (here, under a template that drops earlier
reasoning) trains as step-wise rows carrying each segment's own mask, and every row gets its episode's advantage;
failed episodes are masked at their group's mean reward."""

import pytest
from test_endpoint_episode import DROP_THINK

import algos
from nanosky.agent.trajectory import Trajectory
from nanosky.bundled import resolve_model_path
from nanosky.endpoint.episode import Episode
from nanosky.endpoint.rows import mask_failed, to_trajectory
from nanosky.endpoint.server import Slot
from nanosky.rollout.chat import encode, load_tokenizer
from nanosky.train import stepwise
from nanosky.train.step_credit import step_info

OPENING = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 17 * 23?"}]
THINK = "<think>\nMultiply.\n</think>\nIt is 391."


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(resolve_model_path("tiny-tool"))


def _episode(tok, replies: list[str], group: int, reward: float) -> Trajectory:
    """An episode of user/assistant turns ("Sure?" after each reply), recorded as the endpoint records it."""
    slot, messages = Slot("k", "t", Episode(tok)), list(OPENING)
    for k, text in enumerate(replies):
        ids, cont = slot.episode.prompt(messages, None)
        sampled = encode(tok, text) + [tok.eos_token_id]
        reply = {"role": "assistant", "content": text}
        slot.episode.record(messages, None, ids, cont, sampled, [-0.5] * len(sampled), 0, reply, "stop")
        slot.keys.append(messages[-1]["content"])
        messages = [*messages, reply, {"role": "user", "content": f"Sure? ({k})"}]
    t = Trajectory(group=group, reward=reward, stop_reason="done")
    return to_trajectory(t, slot, None, tok)


def test_one_segment_is_one_row_whose_calls_are_steps(tok):
    t = _episode(tok, ["It is 391.", "Yes."], group=0, reward=1.0)
    assert (t.info["agent"]["segments"], t.info["agent"]["calls"], t.turns, len(t.steps)) == (1, 2, 2, 1)
    steps = step_info([t])
    assert len(steps.spans[0]) == 2 and steps.state_keys[0] == ["What is 17 * 23?", "Sure? (0)"]
    assert steps.rewards[0] == [0.0, 1.0]  # the episode's reward on its last call
    # the step-wise view of the same episode is the same row
    (row,) = stepwise.samples([t])
    assert row.ids == t.ids and row.loss_mask == t.loss_mask


def test_several_segments_train_as_stepwise_rows_with_their_episodes_advantage(tok):
    tok = load_tokenizer(resolve_model_path("tiny-tool"))
    tok.chat_template = DROP_THINK  # Qwen3-style: reasoning before the last user message is dropped
    trajs = [
        _episode(tok, [THINK, "Yes.", "Done."], group=0, reward=1.0),  # 2 segments: the 2nd call re-renders
        _episode(tok, ["It is 400.", "No."], group=0, reward=0.0),  # 1 segment
    ]
    assert [len(t.steps) for t in trajs] == [2, 1]
    rows = stepwise.samples(trajs)
    assert len(rows) == 3 and [r.info["episode"] for r in rows] == [0, 0, 1]
    # the second segment holds 2 calls: its observation ids in between are masked, not trained
    seg2 = rows[1]
    assert seg2.loss_mask[seg2.prompt_len :].count(0) > 0 and sum(seg2.loss_mask) == sum(
        len(encode(tok, x)) + 1 for x in ("Yes.", "Done.")
    )
    assert "Multiply" not in tok.decode(seg2.ids) and "Multiply" in tok.decode(rows[0].ids)
    cfg = algos.preset("grpo")
    adv = stepwise.advantages(trajs, rows, cfg)
    assert adv[0] == adv[1] > 0 > adv[2]  # every row of an episode gets the episode's advantage
    gigpo = algos.preset("gigpo")
    assert stepwise.advantages(trajs, rows, gigpo).shape == (3,)


def test_failed_episodes_are_masked_at_their_groups_mean(tok):
    trajs = [
        _episode(tok, ["a"], 0, 1.0),
        _episode(tok, ["b"], 0, 0.0),
        _episode(tok, ["c"], 0, 0.0),
        _episode(tok, ["d"], 1, 0.5),
    ]
    trajs[2].stop_reason, trajs[3].stop_reason = "error", "timeout"
    mask_failed(trajs, ("error", "timeout"))
    assert trajs[2].reward == 0.5 and trajs[3].reward == 0.0 and not trajs[2].success
    assert sum(trajs[2].loss_mask) == 0 and sum(trajs[2].steps[0].loss_mask) == 0
    assert sum(trajs[0].loss_mask) > 0 and trajs[0].reward == 1.0
