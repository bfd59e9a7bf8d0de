"""The sync probe's tolerance: calibrated at the build sync, refusing a build that did not load the weights, and
catching a stale engine afterwards (`nanosky/sync.py: Probe`)."""

import pytest

from nanosky.rollout.engine import StaleWeightsError
from nanosky.sync import Probe


def _m(gap: float) -> dict[str, float]:
    return {"rollout/logprob_diff_mean": gap, "rollout/logprob_diff_max": 3 * gap}


def test_fp32_calibrates_to_the_floor_and_catches_a_later_stale_engine():
    p = Probe([1, 2, 3])
    p.check(_m(1e-6), "float32", 0, [])  # the build sync: both sides hold the same weights
    assert p.build_gap == 1e-6 and p.tol == 1e-4  # 4 × 1e-6 is under the fp32 floor
    p.check(_m(5e-6), "float32", 1, [])  # numerics of new weights: fine
    with pytest.raises(StaleWeightsError, match=r"0.0005 > 0.0001 after sync to version 2"):
        p.check(_m(5e-4), "float32", 2, ["Failed to load weights"])  # was within the old fixed 1e-3


def test_bf16_calibrates_above_a_large_models_build_gap():
    """A 7B's bf16 build gap (0.03 mean nats, published) would have failed a fixed 0.05 after a little drift."""
    p = Probe([1, 2, 3])
    p.check(_m(0.03), "bfloat16", 0, [])
    assert p.tol == pytest.approx(0.12)
    p.check(_m(0.06), "bfloat16", 1, [])
    with pytest.raises(StaleWeightsError, match="version 2"):
        p.check(_m(0.2), "bfloat16", 2, [])
    small = Probe([1])
    small.check(_m(1e-3), "bfloat16", 0, [])
    assert small.tol == 0.02  # the bf16 floor


@pytest.mark.parametrize("dtype, gap", [("float32", 0.01), ("bfloat16", 2.3)])
def test_a_build_sync_the_engine_missed_is_refused_not_calibrated(dtype, gap):
    """Dummy or old weights at build are nats off: refused under the ceiling, never absorbed into the tolerance."""
    p = Probe([1, 2, 3])
    with pytest.raises(StaleWeightsError, match="the build sync: the engine did not load them") as e:
        p.check(_m(gap), dtype, 0, ["vLLM said something"])
    assert "vLLM: vLLM said something" in str(e.value)
    assert p.tol is None  # nothing calibrated from it


def test_a_fixed_tolerance_is_never_calibrated():
    p = Probe([1], max_mean_diff=0.5)
    p.check(_m(0.4), "bfloat16", 0, [])  # above the build ceiling, but the user fixed the tolerance
    assert p.tol == 0.5
    with pytest.raises(StaleWeightsError):
        p.check(_m(0.6), "bfloat16", 1, [])


def test_one_token_off_at_build_is_refused_by_name_and_position():
    """A disagreement the mean hides (Cohere2's window one position off: mean 6.6e-4 under the old 1e-3): on an fp32
    engine any token over 2e-4 at build refuses the run, naming the architecture and where they part."""
    import torch

    d = torch.full((40,), 1e-6, dtype=torch.float64)
    d[37:] = 5e-3  # the last tokens, past a window
    m = {"rollout/logprob_diff_mean": float(d.mean()), "rollout/logprob_diff_max": float(d.max())}
    assert m["rollout/logprob_diff_mean"] < 1e-3  # the mean ceiling alone would let it train
    with pytest.raises(StaleWeightsError, match=r"Cohere2ForCausalLM: .* from position 38 of the build probe"):
        Probe([1]).check(m, "float32", 0, [], d, "Cohere2ForCausalLM")
    bf16 = Probe([1])
    bf16.check(m, "bfloat16", 0, [], d, "Cohere2ForCausalLM")  # rounding alone moves single bf16 tokens
    fixed = Probe([1], max_mean_diff=0.01)
    fixed.check(m, "float32", 0, [], d, "Cohere2ForCausalLM")  # the user's tolerance overrides
    fine = Probe([1])
    fine.check(_m(1e-6), "float32", 0, [], torch.full((40,), 1e-5, dtype=torch.float64), "Qwen2ForCausalLM")
    assert fine.tol == 1e-4


@pytest.mark.parametrize("preset", ["tool_use", "swe"])
def test_an_agent_envs_probe_is_as_short_as_maths(preset):
    """The probe is a short question and answer in the model's template, whatever the env: an agent env's system
    prompt and tool schemas (~400 tokens on tool_use, more on swe) made its two forwards most of every sync."""
    from transformers import AutoConfig

    from nanosky import presets
    from nanosky.bundled import resolve_model_path
    from nanosky.rollout.chat import load_tokenizer
    from nanosky.sync import build_probe

    cfg = getattr(presets, preset)()
    path = resolve_model_path(cfg.model.path)
    tok = load_tokenizer(path)
    probe = build_probe(cfg, tok, AutoConfig.from_pretrained(path))
    math = build_probe(presets.demo(), tok, AutoConfig.from_pretrained(path))
    assert probe.ids == math.ids == probe.build_ids and 20 < len(probe.ids) < 80
    assert tok.decode(probe.ids).count("12 + 30 = 42") == 1
