"""2 CPU ranks (gloo) through torchrun: a sharded checkpoint round trip (tests/scripts/ckpt_worker.py)."""

import json
import os
import sys

import pytest
from spawn import ROOT, torchrun

SCRIPT = os.path.join(ROOT, "tests", "scripts", "ckpt_worker.py")
sys.path.insert(0, os.path.dirname(SCRIPT))


def test_two_ranks_roundtrip(tmp_path):
    """2 CPU ranks (gloo): sharded save, load into a differently initialised model, identical next steps."""
    out = tmp_path / "out.json"
    r = torchrun(["roundtrip", str(out), str(tmp_path / "ckpt")], timeout=300, script=SCRIPT)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["max_diff"] <= 1e-7
    for ref_losses, losses in res["losses"]:  # per rank
        assert losses == pytest.approx(ref_losses, rel=1e-7, abs=0)
    assert res["losses"][0] != res["losses"][1]  # the ranks really drew different data
    assert res["state"] == {"step": 2}
    print(f"2-rank tiny save {res['save_s']:.3f}s load {res['load_s']:.3f}s")


def test_weights_are_read_once_and_every_shard_equals_a_per_rank_read(tmp_path):
    """Rank 0 alone reads the checkpoint and broadcasts it (`load_sharded`): each rank's shards, buffers and tied
    head equal what reading the whole checkpoint on every rank gave, and rank 1 grows by its shard, not by a copy."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(  # 67M parameters in many small tensors: a shard is clearly half the model
        vocab_size=1030,
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=16,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "model")  # bf16 on disk, as Qwen ships
    out = tmp_path / "out.json"
    script = os.path.join(ROOT, "tests", "scripts", "load_once.py")
    r = torchrun([str(out), str(tmp_path / "model")], timeout=300, script=script)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    print(res)
    assert res["diffs"] == [] and res["checked"] > 100 and res["tied"]
    assert res["gather_diffs"] == [] and res["gather_checked"] > 100, res  # every parameter, and the 2 odd shapes
    # fp32 in memory: 256 MiB for the whole model. Rank 1 holds its half; reading the checkpoint would cost it all.
    assert res["grow_mib"][1] < 0.75 * res["full_mib"], res
