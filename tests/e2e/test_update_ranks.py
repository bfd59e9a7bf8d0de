"""The global-batch loss normalisation: the gradient is the same for any micro-batch size and world size."""

import json
import os

import pytest
import torch
from spawn import ROOT, torchrun

SCRIPT = os.path.join(ROOT, "tests", "scripts", "update_step.py")


TM, SM, SN = "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"
# Every update step the tests below read, as (world, micro_bs, mode, loss, *extra). They run in two launches, one
# per world size, shared by the module (starting torchrun and its ranks costs more than a step); each test reads
# the steps it compares.
SPECS = [
    *[(w, mbs, m, "ppo") for m in (TM, SM, SN) for w, mbs in ((1, 16), (1, 8), (1, 4), (2, 4))],
    (1, 16, TM, "ppo", "adv=reinforce_pp_baseline"),
    (2, 8, TM, "ppo", "adv=reinforce_pp_baseline"),
    (1, 16, TM, "ppo", "ref_kl"),
    *[(1, 16, TM, "ppo", *e) for e in (("pack=none",), ("pack=prefix",), ("pack=flat",), ("tokens=30",))],
    (1, 16, TM, "ppo", "tokens=70", "pack=flat"),
    (2, 16, TM, "ppo", "tokens=30"),
    (1, 16, SM, "ppo", "pack=none"),
    (2, 16, SM, "ppo", "tokens=45"),
    *[
        (w, 4, m, "ppo", "equal=1", f"skip={s}", *e)
        for w in (1, 2)
        for m in (TM, SM)
        for e in ((), ("tokens=30",))
        for s in (0, 1)
    ],
    (2, 4, TM, "ppo", "idle=1", "skip=0"),
    (2, 4, TM, "ppo", "idle=1", "skip=1"),
    (2, 4, TM, "ppo", "equal=4"),
    *[(1, 4, TM, "ppo", "equal=1", f"skip={s}", "old=1") for s in (0, 1)],
    *[
        (2, 4, TM, "ppo", "equal=1", f"skip={s}", "old=1", *e)
        for e in ((), ("tokens=30",), ("idle=1",))
        for s in (0, 1)
    ],
    (1, 16, TM, "ppo", "chunk=0"),
    (2, 4, TM, "ppo", "attn=grouped", "chunk=4"),
]


def _out(root, world: int, micro_bs: int, mode: str, loss: str, *extra: str):
    return root / f"d_{world}_{micro_bs}_{mode}_{loss}{''.join(extra)}.pt"


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    """Each spec's gradient dict (and its metrics beside it, `_out(...)` + ".json"), by spec."""
    root = tmp_path_factory.mktemp("update")
    for world in (1, 2):
        argv = []
        for spec in SPECS:
            if spec[0] == world:
                argv += [";", str(_out(root, *spec)), *map(str, spec[1:])]
        r = torchrun(argv[1:], nproc=world, timeout=600, script=SCRIPT)
        assert r.returncode == 0, r.stderr[-3000:]
    return root


def _grad(root, *spec) -> dict:
    assert spec in SPECS, spec
    return torch.load(_out(root, *spec))


def _metrics(root, *spec) -> dict:
    return json.load(open(str(_out(root, *spec)) + ".json"))


def _close(a: dict, b: dict) -> float:
    worst = 0.0
    for k in a:
        scale = a[k].abs().max().item() + 1e-12
        worst = max(worst, (a[k] - b[k]).abs().max().item() / scale)
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("mode", [TM, SM, SN])
def test_grad_invariant_to_micro_batch_and_world_size(steps, mode):
    ref = _grad(steps, 1, 16, mode, "ppo")
    assert max(v.abs().max().item() for v in ref.values()) > 0  # the update did something
    for mbs in (8, 4):
        assert _close(ref, _grad(steps, 1, mbs, mode, "ppo")) < 1e-4, f"micro_bs={mbs}"
    assert _close(ref, _grad(steps, 2, 4, mode, "ppo")) < 1e-4, "world=2"


@pytest.mark.slow
def test_batch_wide_estimator_sees_every_rank(steps):
    """reinforce_pp_baseline whitens over the whole batch: with 2 ranks each holding half the groups, the gathered
    statistics must give the 1-rank gradient (whitening per rank would not)."""
    ref = _grad(steps, 1, 16, TM, "ppo", "adv=reinforce_pp_baseline")
    assert max(v.abs().max().item() for v in ref.values()) > 0
    assert _close(ref, _grad(steps, 2, 8, TM, "ppo", "adv=reinforce_pp_baseline")) < 1e-4


@pytest.mark.slow
def test_track_ref_kl_logs_kl_without_changing_the_update(steps):
    base, tracked = _grad(steps, 1, 16, TM, "ppo"), _grad(steps, 1, 16, TM, "ppo", "ref_kl")
    assert _close(base, tracked) < 1e-6  # kl_coef = 0: the reference only feeds the log
    assert _metrics(steps, 1, 16, TM, "ppo", "ref_kl")["kl"] > 0.01  # k3 against a reference 1 nat away is far from 0
    assert "kl" not in _metrics(steps, 1, 16, TM, "ppo")


@pytest.mark.slow
def test_packing_and_token_budget_give_the_unpacked_gradient(steps):
    """Shared-prefix packing, flat packing and token-budget micro-batches (1 and 2 ranks; at 30 tokens the ranks
    plan different numbers of micro-batches and must even them out) all give the padded path's update."""
    ref = _grad(steps, 1, 16, TM, "ppo", "pack=none")
    assert max(v.abs().max().item() for v in ref.values()) > 0
    for extra in (("pack=prefix",), ("pack=flat",), ("tokens=30",), ("tokens=70", "pack=flat")):
        assert _close(ref, _grad(steps, 1, 16, TM, "ppo", *extra)) < 1e-5, extra
    assert _close(ref, _grad(steps, 2, 16, TM, "ppo", "tokens=30")) < 1e-4, "world=2"
    seq = _grad(steps, 1, 16, SM, "ppo", "pack=none")
    assert _close(seq, _grad(steps, 2, 16, SM, "ppo", "tokens=45")) < 1e-4


@pytest.mark.slow
def test_skipping_zero_advantage_rows_keeps_the_gradient(steps):
    """Groups whose rewards are all equal have zero advantage: their rows are left out of forward and backward
    (`optim.skip_zero_adv`) but still count in the normalisers, so the update is the same. At 2 ranks with one
    equal group, the ranks keep different numbers of rows and must still run the same number of passes."""
    for world in (1, 2):
        for mode in (TM, SM):
            for extra in ((), ("tokens=30",)):
                ref = _grad(steps, world, 4, mode, "ppo", "equal=1", "skip=0", *extra)
                got = _grad(steps, world, 4, mode, "ppo", "equal=1", "skip=1", *extra)
                assert max(v.abs().max().item() for v in ref.values()) > 0
                assert _close(ref, got) < 1e-5, (mode, world, extra)
                m = _metrics(steps, world, 4, mode, "ppo", "equal=1", "skip=1", *extra)
                assert m["skipped_rows_frac"] == pytest.approx(0.25)  # 1 group of 4 left out
    # one rank with nothing to train (all its groups equal) while the other trains: it runs only blank passes, and
    # the metrics' all-reduce must still match (regression: a gloo size mismatch crashed a 2-rank swe run)
    ref, got = (_grad(steps, 2, 4, TM, "ppo", "idle=1", f"skip={s}") for s in (0, 1))
    assert _close(ref, got) < 1e-5 and max(v.abs().max().item() for v in got.values()) > 0
    m = _metrics(steps, 2, 4, TM, "ppo", "idle=1", "skip=1")
    assert m["skipped_rows_frac"] == pytest.approx(0.5) and m["pg_loss"] != 0.0
    # every group equal: nothing to train on any rank; the gradient is exactly 0 and every row is skipped
    assert max(v.abs().max().item() for v in _grad(steps, 2, 4, TM, "ppo", "equal=4").values()) == 0
    m = _metrics(steps, 2, 4, TM, "ppo", "equal=4")
    assert m["skipped_rows_frac"] == 1.0 and m["pg_loss"] == 0.0  # still logged
    assert "entropy" not in m and "clip_frac" not in m  # over no trained token: absent, not a reassuring 0


@pytest.mark.slow
def test_old_logprobs_only_for_rows_the_update_trains(steps):
    """With mini-batches, the old logprobs are a forward pass before the update; under `skip_zero_adv` it scores
    only the rows with an advantage (a skipped row's are never read). The update is the one from every row's old
    logprobs, and the rows scored equal the full pass (up to float sums: they are packed with other rows), at 1 and
    2 ranks and on a rank with nothing to train."""
    for world, extra in ((1, ()), (2, ()), (2, ("tokens=30",)), (2, ("idle=1",))):
        ref, got = (_grad(steps, world, 4, TM, "ppo", "equal=1", f"skip={s}", "old=1", *extra) for s in (0, 1))
        assert max(v.abs().max().item() for v in ref.values()) > 0
        assert _close(ref, got) < 1e-5, (world, extra)
        m = _metrics(steps, world, 4, TM, "ppo", "equal=1", "skip=1", "old=1", *extra)
        assert m["old_max_diff"] < 1e-5 and m["skipped_rows_frac"] > 0


@pytest.mark.slow
def test_grouped_attention_and_the_chunked_head_keep_the_gradient(steps):
    """2 ranks with prefix-grouped attention and the chunked LM head (4-token chunks) against 1 rank with the dense
    mask and the plain head: the same gradient."""
    ref = _grad(steps, 1, 16, TM, "ppo", "chunk=0")
    assert max(v.abs().max().item() for v in ref.values()) > 0
    assert _close(ref, _grad(steps, 2, 4, TM, "ppo", "attn=grouped", "chunk=4")) < 1e-4
