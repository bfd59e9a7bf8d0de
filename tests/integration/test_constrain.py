"""Constrained actions (nanosky/train/constrain.py): the engine samples only admissible actions, and the trainer's masked
logprobs are the engine's, on the real vLLM engine and the bundled tiny model."""

import pytest
import torch

from nanosky.agent import AgentRunner, EngineBackend, EnvTask
from nanosky.agent.trajectory import Trajectory
from nanosky.rollout.engine import SamplingSpec
from nanosky.train import constrain
from nanosky.train.batch import to_batch

CHOICES = ["go to cabinet 1", "go to cabinet 10", "take apple 2 from fridge 1", "click[b0585z]", "look"]


@pytest.fixture(scope="module")
def model(tiny_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def masker(tok, model):
    return constrain.ChoiceMasker(tok, model.config.vocab_size)


def _sample(engine, tok, choices, n=16, seed=0):
    prompt = tok("You are in the middle of a room. Your task is to: put an apple in the fridge.")["input_ids"]
    out = engine.generate([prompt], SamplingSpec(n=n, max_tokens=64, seed=seed, choices=tuple(choices)))[0]
    return prompt, out


def test_engine_samples_only_the_choices(engine, tok):
    prompt, out = _sample(engine, tok, CHOICES)
    texts = [tok.decode(o.token_ids, skip_special_tokens=True) for o in out]
    assert set(texts) <= set(CHOICES), texts
    assert all(o.token_ids[-1] == tok.eos_token_id for o in out)  # a complete choice, then end of turn
    free = engine.generate([prompt], SamplingSpec(n=16, max_tokens=24, seed=0))[0]
    assert not {tok.decode(o.token_ids, skip_special_tokens=True) for o in free} <= set(CHOICES)


@pytest.mark.parametrize("packed", [False, True])
def test_trainer_masked_logprobs_equal_the_engines(engine, tok, model, masker, packed):
    """The engine's logprobs are of the masked distribution; the trainer, given the masks, computes the same ones
    (unmasked, they differ by the mass the mask removed)."""
    from nanosky.train import packing
    from nanosky.train.policy import token_logprobs

    prompt, out = _sample(engine, tok, CHOICES, n=8, seed=3)
    rows = []
    for o in out:
        n = len(prompt)
        rows.append(
            Trajectory(
                ids=prompt + o.token_ids,
                loss_mask=[0] * n + [1] * len(o.token_ids),
                logprobs=[0.0] * n + o.logprobs,
                constraints=[(n, CHOICES)],
            )
        )
    batch = to_batch(rows, tok.pad_token_id, torch.device("cpu"))
    masker.attach(batch, rows)
    assert len(batch.choice_pos) == sum(len(o.token_ids) for o in out)
    ids, att, T = batch.inputs()
    with torch.no_grad():
        if packed:
            p = packing.pack([r.ids for r in rows], T, 4096, True, pad_id=0, device=torch.device("cpu"))
            keep = batch.loss_mask[:, :T] > 0
            lp, ent = packing.logprobs(model, p, True, keep=keep, allowed=batch.allowed(T))
            free, _ = packing.logprobs(model, p, keep=keep)
        else:
            lp, ent = token_logprobs(model, ids, att, True, allowed=batch.allowed(T))
            free, _ = token_logprobs(model, ids, att)
    m = batch.loss_mask[:, :T] > 0
    eng = batch.rollout_logprobs[:, :T]
    assert (lp[m] - eng[m]).abs().max() < 1e-5
    assert (free[m] - eng[m]).abs().max() > 0.1  # the mask matters: without it the trainer scores another policy
    assert (ent[m] >= -1e-6).all() and torch.isfinite(ent[m]).all()
    # a position where the mask leaves one token (e.g. inside "b0585z" after "click[b0") is certain: logprob 0
    single = constrain.unpack(batch.choice_bits, model.config.vocab_size).sum(-1) == 1
    assert single.any()
    r, t = batch.choice_pos[single].unbind(-1)
    assert lp[r, t].abs().max() < 1e-6 and ent[r, t].abs().max() < 1e-6


def test_masked_loss_has_finite_gradients(tok, model, masker):
    ids = tok("look")["input_ids"] + [tok.eos_token_id]
    prompt = tok("Your task is to: look around.")["input_ids"]
    row = Trajectory(
        ids=prompt + ids,
        loss_mask=[0] * len(prompt) + [1] * len(ids),
        logprobs=[0.0] * (len(prompt) + len(ids)),
        constraints=[(len(prompt), CHOICES)],
    )
    from nanosky.train.policy import token_logprobs

    batch = to_batch([row], tok.pad_token_id, torch.device("cpu"))
    masker.attach(batch, [row])
    model.zero_grad()
    ids_, att, T = batch.inputs()
    lp, _ = token_logprobs(model, ids_, att, allowed=batch.allowed(T))
    (-(lp * batch.loss_mask[:, :T]).sum()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    model.zero_grad()


def test_masker_refuses_a_token_outside_the_choices(tok, masker):
    bad = tok("open drawer 3")["input_ids"]
    with pytest.raises(ValueError, match="outside its rule"):
        masker.turn_bits(CHOICES, bad)


def test_batch_slice_keeps_each_rows_masks(tok, masker):
    rows = []
    for i, c in enumerate(["look", "go to cabinet 10", "click[b0585z]"]):
        p = tok(f"step {i}")["input_ids"]
        a = tok(c)["input_ids"] + [tok.eos_token_id]
        rows.append(
            Trajectory(
                ids=p + a,
                loss_mask=[0] * len(p) + [1] * len(a),
                logprobs=[0.0] * (len(p) + len(a)),
                constraints=[(len(p), CHOICES)],
            )
        )
    batch = to_batch(rows + [None], tok.pad_token_id, torch.device("cpu"))
    masker.attach(batch, rows + [None])
    for idx in ([2, 0], slice(1, 3), [3]):
        sub = batch.slice(idx)
        picked = torch.arange(4)[idx].tolist()
        for new, old in enumerate(picked):
            a = batch.choice_pos[:, 0] == old
            b = sub.choice_pos[:, 0] == new
            assert torch.equal(batch.choice_pos[a][:, 1], sub.choice_pos[b][:, 1])
            assert torch.equal(batch.choice_bits[a], sub.choice_bits[b])
        assert len(sub.choice_pos) == sum(int((batch.choice_pos[:, 0] == o).sum()) for o in picked)
        # a blank micro-batch (mask zeroed to keep FSDP in step) scores no constrained position
        from nanosky.train.update import blank

        assert blank(batch).allowed(batch.loss_mask.shape[1]) is None
        # the positions are exactly the loss mask's
        assert torch.equal(sub.loss_mask[sub.choice_pos[:, 0], sub.choice_pos[:, 1]], torch.ones(len(sub.choice_pos)))


def test_runner_constrains_every_turn_to_the_admissible_actions(engine, tok):
    """Through the agent loop, step-wise: every action of the episode is valid, and each step records its choices."""
    runner = AgentRunner(
        EngineBackend(engine, tok),
        tok=tok,
        max_turns=6,
        max_tokens_per_turn=48,
        history_window=1,
        max_total_tokens=512,
        constrain_actions=True,
    )

    def tasks():
        return [EnvTask.make("alfworld_lite", "test", s, show_actions=True, n_receptacles=[3, 4]) for s in range(3)]

    trajs = runner.run(tasks(), sample_seed=0)
    for t in trajs:
        assert t.stop_reason in ("done", "max_turns"), t.error
        assert t.steps and all(s.constraint for s in t.steps)
        for s, m in zip(t.steps, [m for m in t.messages if m["role"] == "assistant"]):
            assert m["content"] in s.constraint
        assert len(t.constraints) == len(t.steps)
        # the env never answered "Nothing happens." (alfworld's reply to an invalid command)
        assert not any(m["role"] == "user" and m["content"].startswith("Nothing happens") for m in t.messages)
    # and without the flag the same episodes do go astray (the tiny text model does not know the commands)
    free = AgentRunner(
        EngineBackend(engine, tok), tok=tok, max_turns=6, max_tokens_per_turn=48, history_window=1, max_total_tokens=512
    ).run(tasks(), sample_seed=0)
    assert not any(t.constraints for t in free)
    valid = {a for t in trajs for s in t.steps for a in s.constraint}
    assert any(m["content"] not in valid for t in free for m in t.messages if m["role"] == "assistant")


def test_engine_samples_well_formed_tool_calls_under_a_grammar(engine, tok, model, masker):
    """A grammar rule (swe's: exactly one call of bash / str_replace_editor / submit): a model that was never shown
    the format writes only calls that parse and that the tools accept, and the trainer's masked logprobs are the
    engine's."""
    from envs.swe.env import SubmitTool
    from envs.tools import BashTool, StrReplaceEditor, parse_tool_calls, tool_call_grammar, validate_arguments
    from nanosky.train.policy import token_logprobs

    tools = {t.name: t for t in (BashTool(), StrReplaceEditor(), SubmitTool())}
    grammar = tool_call_grammar(list(tools.values()))
    prompt = tok("Fix the issue in this repo with the tools, then call submit.")["input_ids"]
    out = engine.generate([prompt], SamplingSpec(n=16, max_tokens=96, seed=0, grammar=grammar))[0]
    finished = [o for o in out if o.token_ids[-1] == tok.eos_token_id]
    assert len(finished) >= 4, [tok.decode(o.token_ids) for o in out]
    for o in finished:
        [call] = parse_tool_calls(tok.decode(o.token_ids, skip_special_tokens=True))
        assert call.error is None and call.name in tools
        assert validate_arguments(tools[call.name].parameters, call.arguments)[1] is None
    free = engine.generate([prompt], SamplingSpec(n=16, max_tokens=96, seed=0))[0]
    assert not any(parse_tool_calls(tok.decode(o.token_ids, skip_special_tokens=True)) for o in free)
    n = len(prompt)
    rows = [
        Trajectory(
            ids=prompt + o.token_ids,
            loss_mask=[0] * n + [1] * len(o.token_ids),
            logprobs=[0.0] * n + o.logprobs,
            constraints=[(n, grammar)],
        )
        for o in out
    ]
    batch = to_batch(rows, tok.pad_token_id, torch.device("cpu"), masker=masker)
    ids, att, T = batch.inputs()
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, att, allowed=batch.allowed(T))
    m = batch.loss_mask[:, :T] > 0
    assert (lp[m] - batch.rollout_logprobs[:, :T][m]).abs().max() < 1e-5
