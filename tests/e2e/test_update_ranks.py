"""The global-batch loss normalisation: the gradient is the same for any micro-batch size and world size."""

import os

import pytest
import torch
from spawn import ROOT, torchrun

SCRIPT = os.path.join(ROOT, "tests", "scripts", "update_step.py")


def _runs(tmp_path, world: int, *specs: tuple) -> list[dict]:
    """Update steps `(micro_bs, mode, loss, *extra)` at `world` ranks, one after the other in one launch (starting
    torchrun and its ranks costs more than a step); each step's gradient dict."""
    outs, argv = [], []
    for micro_bs, mode, loss, *extra in specs:
        outs.append(tmp_path / f"d_{world}_{micro_bs}_{mode}_{loss}{''.join(extra)}.pt")
        argv += [";", str(outs[-1]), str(micro_bs), mode, loss, *extra]
    r = torchrun(argv[1:], nproc=world, timeout=600, script=SCRIPT)
    assert r.returncode == 0, r.stderr[-3000:]
    return [torch.load(o) for o in outs]


def _run(tmp_path, world: int, micro_bs: int, mode: str, loss: str = "ppo", *extra: str) -> dict:
    return _runs(tmp_path, world, (micro_bs, mode, loss, *extra))[0]


def _close(a: dict, b: dict) -> float:
    worst = 0.0
    for k in a:
        scale = a[k].abs().max().item() + 1e-12
        worst = max(worst, (a[k] - b[k]).abs().max().item() / scale)
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_grad_invariant_to_micro_batch_and_world_size(tmp_path, mode):
    ref, *others = _runs(tmp_path, 1, (16, mode, "ppo"), (8, mode, "ppo"), (4, mode, "ppo"))
    assert max(v.abs().max().item() for v in ref.values()) > 0  # the update did something
    for mbs, got in zip((8, 4), others):
        assert _close(ref, got) < 1e-4, f"micro_bs={mbs}"
    assert _close(ref, _run(tmp_path, 2, 4, mode)) < 1e-4, "world=2"


@pytest.mark.slow
def test_batch_wide_estimator_sees_every_rank(tmp_path):
    """reinforce_pp_baseline whitens over the whole batch: with 2 ranks each holding half the groups, the gathered
    statistics must give the 1-rank gradient (whitening per rank would not)."""
    ref = _run(tmp_path, 1, 16, "token-mean", "ppo", "adv=reinforce_pp_baseline")
    assert max(v.abs().max().item() for v in ref.values()) > 0
    assert _close(ref, _run(tmp_path, 2, 8, "token-mean", "ppo", "adv=reinforce_pp_baseline")) < 1e-4


@pytest.mark.slow
def test_track_ref_kl_logs_kl_without_changing_the_update(tmp_path):
    import json

    base, tracked = _runs(tmp_path, 1, (16, "token-mean", "ppo"), (16, "token-mean", "ppo", "ref_kl"))
    assert _close(base, tracked) < 1e-6  # kl_coef = 0: the reference only feeds the log
    m = json.load(open(str(tmp_path / "d_1_16_token-mean_pporef_kl.pt") + ".json"))
    assert m["kl"] > 0.01  # k3 against a reference 1 nat away from most tokens is far from 0
    assert "kl" not in json.load(open(str(tmp_path / "d_1_16_token-mean_ppo.pt") + ".json"))


@pytest.mark.slow
def test_packing_and_token_budget_give_the_unpacked_gradient(tmp_path):
    """Shared-prefix packing, flat packing and token-budget micro-batches (1 and 2 ranks; at 30 tokens the ranks
    plan different numbers of micro-batches and must even them out) all give the padded path's update."""
    extras = (("pack=prefix",), ("pack=flat",), ("tokens=30",), ("tokens=70", "pack=flat"))
    ref, *others = _runs(tmp_path, 1, *[(16, "token-mean", "ppo", *e) for e in (("pack=none",), *extras)])
    assert max(v.abs().max().item() for v in ref.values()) > 0
    for extra, got in zip(extras, others):
        assert _close(ref, got) < 1e-5, extra
    assert _close(ref, _run(tmp_path, 2, 16, "token-mean", "ppo", "tokens=30")) < 1e-4, "world=2"
    seq = _run(tmp_path, 1, 16, "seq-mean-token-mean", "ppo", "pack=none")
    assert _close(seq, _run(tmp_path, 2, 16, "seq-mean-token-mean", "ppo", "tokens=45")) < 1e-4


@pytest.mark.slow
def test_skipping_zero_advantage_rows_keeps_the_gradient(tmp_path):
    """Groups whose rewards are all equal have zero advantage: their rows are left out of forward and backward
    (`optim.skip_zero_adv`) but still count in the normalisers, so the update is the same. At 2 ranks with one
    equal group, the ranks keep different numbers of rows and must still run the same number of passes."""
    import json

    cases = [(mode, extra) for mode in ("token-mean", "seq-mean-token-mean") for extra in ((), ("tokens=30",))]
    for world in (1, 2):
        specs = [(4, mode, "ppo", "equal=1", f"skip={s}", *extra) for mode, extra in cases for s in (0, 1)]
        if world == 2:
            # one rank with nothing to train (all its groups equal) while the other trains: it runs only blank
            # passes, and the metrics' all-reduce must still match (regression: a gloo size mismatch crashed a
            # 2-rank swe run); then every group equal: nothing to train on any rank
            specs += [
                (4, "token-mean", "ppo", "idle=1", "skip=0"),
                (4, "token-mean", "ppo", "idle=1", "skip=1"),
            ]
            specs += [(4, "token-mean", "ppo", "equal=4")]
        grads = _runs(tmp_path, world, *specs)
        for i, (mode, extra) in enumerate(cases):
            ref, got = grads[2 * i], grads[2 * i + 1]
            assert max(v.abs().max().item() for v in ref.values()) > 0
            assert _close(ref, got) < 1e-5, (mode, world, extra)
            out = tmp_path / f"d_{world}_4_{mode}_ppoequal=1skip=1{''.join(extra)}.pt"
            m = json.load(open(str(out) + ".json"))
            assert m["skipped_rows_frac"] == pytest.approx(0.25)  # 1 group of 4 left out
    ref, got, zero = grads[-3:]
    assert _close(ref, got) < 1e-5 and max(v.abs().max().item() for v in got.values()) > 0
    m = json.load(open(str(tmp_path / "d_2_4_token-mean_ppoidle=1skip=1.pt") + ".json"))
    assert m["skipped_rows_frac"] == pytest.approx(0.5) and m["pg_loss"] != 0.0
    # every group equal: the gradient is exactly 0 and every row is skipped
    assert max(v.abs().max().item() for v in zero.values()) == 0
    m = json.load(open(str(tmp_path / "d_2_4_token-mean_ppoequal=4.pt") + ".json"))
    assert m["skipped_rows_frac"] == 1.0 and m["pg_loss"] == 0.0  # still logged
    assert "entropy" not in m and "clip_frac" not in m  # over no trained token: absent, not a reassuring 0


@pytest.mark.slow
def test_old_logprobs_only_for_rows_the_update_trains(tmp_path):
    """With mini-batches, the old logprobs are a forward pass before the update; under `skip_zero_adv` it scores
    only the rows with an advantage (a skipped row's are never read). The update is the one from every row's old
    logprobs, and the rows scored equal the full pass (up to float sums: they are packed with other rows), at 1 and
    2 ranks and on a rank with nothing to train."""
    import json

    cases = ((1, ()), (2, ()), (2, ("tokens=30",)), (2, ("idle=1",)))
    grads = {}
    for world in (1, 2):
        mine = [extra for w, extra in cases if w == world]
        specs = [(4, "token-mean", "ppo", "equal=1", f"skip={s}", "old=1", *extra) for extra in mine for s in (0, 1)]
        got = _runs(tmp_path, world, *specs)
        grads |= {(world, extra): (got[2 * i], got[2 * i + 1]) for i, extra in enumerate(mine)}
    for world, extra in cases:
        ref, got = grads[(world, extra)]
        assert max(v.abs().max().item() for v in ref.values()) > 0
        assert _close(ref, got) < 1e-5, (world, extra)
        m = json.load(
            open(str(tmp_path / f"d_{world}_4_token-mean_ppoequal=1skip=1old=1{''.join(extra)}.pt") + ".json")
        )
        assert m["old_max_diff"] < 1e-5 and m["skipped_rows_frac"] > 0


@pytest.mark.slow
def test_grouped_attention_and_the_chunked_head_keep_the_gradient(tmp_path):
    """2 ranks with prefix-grouped attention and the chunked LM head (4-token chunks) against 1 rank with the dense
    mask and the plain head: the same gradient."""
    ref = _run(tmp_path, 1, 16, "token-mean", "ppo", "chunk=0")
    assert max(v.abs().max().item() for v in ref.values()) > 0
    got = _run(tmp_path, 2, 4, "token-mean", "ppo", "attn=grouped", "chunk=4")
    assert _close(ref, got) < 1e-4
