"""Prefix-grouped attention (`nanosky.train.grouped_attention`) against the dense ancestor mask, the reference: the
same log p, entropy and gradients on packed rows, with sliding windows, GQA, several rows and a deeper trie."""

import copy

import pytest
import torch
from families import build
from gradcheck import assert_same, logprobs_and_grads

from nanosky.train import grouped_attention, head, packing


def _workload(vocab: int, seed: int = 0):
    """Two groups (a prompt, completions), one with a branch shared past its prompt, and a lone sequence."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    a, b = rand(20), rand(14)
    seqs = [a + rand(k) for k in (9, 5, 12)] + [b + rand(k) for k in (7, 3)] + [rand(11)]
    seqs[2][20:24] = seqs[1][20:24]  # a deeper trie: a branch shared past the prompt
    seqs.append(list(seqs[3]))  # a duplicate: it adds no token of its own
    T = max(len(s) for s in seqs) - 1
    keep = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        keep[i, : len(s) - 1] = True
    return seqs, T, keep


@pytest.fixture(scope="module", params=["qwen2", "mistral_swa", "qwen3"])
def models(request, tmp_path_factory):
    """(dense, grouped): the same weights, one on SDPA with the dense mask, one on grouped attention."""
    from transformers import AutoModelForCausalLM

    path = build(request.param, str(tmp_path_factory.mktemp(request.param)))
    dense = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    grouped = copy.deepcopy(dense)
    assert grouped_attention.enable(grouped) and grouped_attention.enabled(grouped)
    assert not grouped_attention.enabled(dense)
    return dense, grouped


@pytest.mark.parametrize("chunk", [0, 8])  # the plain LM head, and the chunked head (its decoder call)
@pytest.mark.parametrize("row_tokens", [1024, 40])
def test_log_p_entropy_and_gradients_equal_the_dense_mask(models, row_tokens, chunk):
    dense, grouped = models
    for m in models:
        head.install(m)
    seqs, T, keep = _workload(dense.config.vocab_size)
    p = packing.pack(seqs, T, row_tokens=row_tokens)
    assert sum(n for _, _, n, _ in p.segments.segs) == p.unique_tokens  # the segments tile the real tokens
    adv = torch.randn(keep.shape, generator=torch.Generator().manual_seed(1))

    ref = logprobs_and_grads(dense, p, keep, adv, chunk=chunk)
    assert_same(ref, logprobs_and_grads(grouped, p, keep, adv, chunk=chunk), keep)


def test_the_build_check_and_unsegmented_forwards_run_on_grouped_attention(models):
    dense, grouped = models
    assert packing.verify(grouped, packing.lm_forward(grouped), 1e-4) < 1e-5  # packed (grouped) vs unpacked
    ids = torch.randint(3, 500, (2, 16))
    with torch.no_grad():  # a forward without segments is transformers' SDPA
        torch.testing.assert_close(grouped(input_ids=ids).logits, dense(input_ids=ids).logits, rtol=0, atol=0)


def test_the_choice_by_device_and_flag():
    from nanosky.config.model import OptimConfig

    assert OptimConfig().grouped("cuda") and not OptimConfig().grouped("cpu")  # auto: flash kernels on CUDA
    assert OptimConfig(packed_attention="grouped").grouped("cpu")
    assert not OptimConfig(packed_attention="mask").grouped("cuda")
    assert not OptimConfig(packing="none").grouped("cuda")  # unpacked rows have no segments
