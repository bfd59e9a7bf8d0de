"""Sliding-window attention under prefix packing: each sliding layer gets its window in the packed mask (Mistral:
every layer; Gemma 2 / 3: per layer kind), so packed equals unpacked. Without it, packed rows attend across the
whole window and the logprobs are silently wrong: the test shows that difference too, so it can fail."""

import pytest
import torch
from families import build

from nanosky.train import packing
from nanosky.train.policy import attn_implementation


@pytest.mark.parametrize("family", ["mistral_swa", "gemma2", "gemma3"])
def test_packing_applies_each_layers_window(family, tmp_path):
    from transformers import AutoModelForCausalLM

    path = build(family, str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=attn_implementation(path)
    )
    kinds, window = packing.attention_kinds(model.config)
    assert window == 16 and packing.SLIDING in kinds
    forward = packing.lm_forward(model)
    assert packing.verify(model, forward, tol=1e-5) < 1e-5  # packed == unpacked, sequences of 48 > 16 tokens

    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(3, 500, (40,), generator=g).tolist() for _ in range(2)]
    p = packing.pack(seqs, T=39)
    with torch.no_grad():
        ignored = p.gather(forward(p.input_ids, p.attention_mask, p.position_ids))  # the trie mask, no window
        right = p.gather(forward(p.input_ids, packing.attention_mask(model, p), p.position_ids))
        plain = forward(torch.tensor(seqs), torch.ones(2, 40, dtype=torch.long), None)[:, :39]
    assert (right - plain).abs().max() < 1e-5
    assert (ignored - plain).abs().max() > 1e-2  # what packing computed before: wrong past the window


def test_soft_capped_attention_trains_eager(tmp_path):
    """transformers' SDPA path drops attention soft-capping (Gemma 2), which vLLM applies: such models load eager."""
    assert attn_implementation(build("gemma2", str(tmp_path))) == "eager"
    assert attn_implementation(build("gemma3", str(tmp_path))) == "sdpa"
    assert attn_implementation(build("llama", str(tmp_path))) == "sdpa"


def test_the_build_check_compares_target_token_logprobs_not_the_whole_vocabulary(tmp_path):
    """What training uses is log p(next token). A packed forward that differs only at other vocabulary entries (a
    bf16 rounding flip at a large logit) passes; one that differs at a target token is refused."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build("mistral_swa", str(tmp_path)), dtype=torch.float32)
    forward = packing.lm_forward(model)

    def perturbed(at_targets: bool):
        def f(ids, mask, pos):
            out = forward(ids, mask, pos)  # [R, L, V]
            if mask.ndim != 4:  # the unpacked reference stays exact
                return out
            # the probe's tokens are drawn from ids >= 3: entries 0-2 are never a target, the rest hold every target
            cols = torch.arange(out.shape[-1]) >= 3
            return out + 0.5 * (cols if at_targets else ~cols)

        return f

    assert packing.verify(model, perturbed(at_targets=False), tol=1e-4) < 1e-4
    with pytest.raises(packing.PackingUnsupported, match="differ by 0.5"):
        packing.verify(model, perturbed(at_targets=True), tol=1e-4)


def test_the_build_check_allows_the_models_own_rounding_and_still_refuses_a_missed_window(tmp_path, monkeypatch):
    """A deep model in bf16 rounds differently in every kernel shape: packed vs unpacked then differs by about what
    a sequence differs from itself right-padded (0.3-0.5 nats on a random 7B-shaped model, H100). Such noise passes
    the check; a missed window, far larger, is still refused with the noise on top."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build("mistral_swa", str(tmp_path)), dtype=torch.float32)
    forward = packing.lm_forward(model)

    def rounding(ids, mask, pos, **kw):  # a shape-dependent error, as bf16 kernels make; none for one plain row
        out = forward(ids, mask, pos, **kw)
        plain = isinstance(mask, torch.Tensor) and mask.shape == ids.shape and bool(mask.all())
        if not plain:
            g = torch.Generator().manual_seed(ids.shape[-1])
            out = out + 0.3 * torch.rand(out.shape[:-1], generator=g)[..., None]  # log p(target) moves by < 0.3
        return out

    got = packing.verify(model, rounding, tol=0.1)
    assert 0.1 < got < 0.3  # above the fixed tolerance: passed on the model's measured rounding
    real = packing.attention_kinds
    monkeypatch.setattr(packing, "attention_kinds", lambda cfg: ([packing.FULL] * len(real(cfg)[0]), None))
    with pytest.raises(packing.PackingUnsupported, match=r"differ by [1-9].* 2x the model's own rounding, 0\.[12]"):
        packing.verify(model, rounding, tol=0.1)  # the probe still spans the window: packed ignores it
