"""A generation cut by `EngineBackend.pause` (a partial rollout's phase end) goes on under new weights from its own
ids: nothing re-tokenised, each id stamped with the weight version that sampled it, and the ids sampled after the
pause carry the new weights' logprobs, as a fresh forward gives them (a stale KV or prefix cache would show)."""

import asyncio

import torch

from nanosky.agent import EngineBackend
from nanosky.agent.backends import Request
from nanosky.rollout.loop import RankLoop

NEW = 40  # tokens per request


def test_a_paused_generation_resumes_under_new_weights_from_its_own_ids(engine, tok, tiny_path):
    from transformers import AutoModelForCausalLM

    sd = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).state_dict()
    v = engine.version
    backend, loop = EngineBackend(engine, tok, version=v), RankLoop()
    texts = ["What is 12 + 30?", "Name a prime number.", "Count to five."]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    reqs = [Request([], None, NEW, 1.0, p, seed=100 + i, ignore_eos=True) for i, p in enumerate(prompts)]

    async def first_phase():
        tasks = [asyncio.ensure_future(backend.generate(r)) for r in reqs]
        while backend.engine_steps < 10:  # ~10 tokens each, then the phase ends
            await asyncio.sleep(0)
        assert backend.pause() == len(reqs) and not engine.has_unfinished()
        return tasks

    async def second_phase(tasks):
        backend.resume(v + 1)
        return await asyncio.gather(*tasks)

    try:
        tasks = loop.run(first_phase())
        assert not any(t.done() for t in tasks)  # cut, waiting for the next phase
        engine.load_weights(((k, t * 1.1) for k, t in sd.items()), version=v + 1)
        outs = loop.run(second_phase(tasks))
        new = [engine.prompt_logprobs(p + o.token_ids)[len(p) - 1 :] for p, o in zip(prompts, outs)]  # [NEW] each
        engine.load_weights(iter(sd.items()), version=v + 2)  # the old weights again, for the ids before the pause
        old = [engine.prompt_logprobs(p + o.token_ids)[len(p) - 1 :] for p, o in zip(prompts, outs)]
    finally:
        loop.close()
    prefilled = 0
    for p, o, lp_new, lp_old in zip(prompts, outs, new, old):
        k = o.versions.count(v)  # sampled before the pause
        assert len(o.token_ids) == len(o.logprobs) == NEW and o.finish_reason == "length"
        assert 0 < k < NEW and o.versions == [v] * k + [v + 1] * (NEW - k)
        got = torch.tensor(o.logprobs, dtype=torch.float64)
        assert (got[k:] - lp_new[k:]).abs().max() < 1e-4  # after the pause: the new weights, from a fresh prefill
        assert (got[:k] - lp_old[:k]).abs().max() < 1e-4  # before it: the old weights
        assert (got[:k] - lp_new[:k]).abs().mean() > 1e-2  # and the two really differ
        prefilled += len(p) + k
    assert backend.resumed_prefill_tokens == prefilled
