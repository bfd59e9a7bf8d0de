"""Each component decides its own schedule (torchtitan's `checkpointer.save(step, last_step=...)`): the evaluator
and the checkpointer say when they are due; the loop only asks. Also the testing-only flags' new home."""

import logging
import math

import pytest

import algos
from nanosky.cli import parse_args
from nanosky.evaluate import Evaluator
from nanosky.logger import RunLogger
from nanosky.precision import decide
from nanosky.train.checkpointer import Checkpointer


def _cfg(*flags):
    return parse_args(["--preset", "smoke", *flags], console=False)


def test_checkpointer_is_due_every_k_steps_but_leaves_the_last_to_close():
    ck = Checkpointer(_cfg("--steps", "7", "--log.ckpt-every", "3"), None, tok=None, policy=None, update=None)
    assert [s for s in range(1, 8) if ck.due(s)] == [3, 6]
    ck = Checkpointer(_cfg("--steps", "6", "--log.ckpt-every", "3"), None, tok=None, policy=None, update=None)
    assert [s for s in range(1, 7) if ck.due(s)] == [3]  # step 6 is the final checkpoint, written by close
    assert not any(
        Checkpointer(_cfg("--log.ckpt-every", "0"), None, tok=None, policy=None, update=None).due(s) for s in range(9)
    )


def test_partial_rollouts_drain_before_every_checkpoint_the_last_one_too():
    ck = Checkpointer(_cfg("--steps", "7", "--log.ckpt-every", "3"), None, tok=None, policy=None, update=None)
    assert [s for s in range(1, 8) if ck.drains(s)] == [3, 6, 7]
    ck = Checkpointer(_cfg("--steps", "5", "--log.ckpt-every", "0"), None, tok=None, policy=None, update=None)
    assert [s for s in range(1, 6) if ck.drains(s)] == [5]  # no periodic checkpoint: only the final one


def test_close_writes_no_checkpoint_where_no_step_ran_since_the_last_on_disk(monkeypatch):
    saved = []

    def save(self, step, version, acc0):
        saved.append(step)
        self.last_saved, self.last_path = step, f"ckpts/step_{step:06d}"
        return f"ckpts/step_{step:06d}/export"

    monkeypatch.setattr(Checkpointer, "save", save)
    # --steps 0 (an eval of the model as loaded): nothing trained, nothing written
    ck = Checkpointer(_cfg("--steps", "0"), None, tok=None, policy=None, update=None)
    assert ck.save_once(0, 0, 0.5) is None and saved == []
    # a run that trained: its last step is written at close
    ck = Checkpointer(_cfg("--steps", "4"), None, tok=None, policy=None, update=None)
    assert ck.save_once(4, 4, 0.5) == "ckpts/step_000004/export" and saved == [4]
    # resumed at its last step: the checkpoint on disk is the final one, not written again
    ck.last_saved, ck.last_path = 4, "run/checkpoints/step_000004"
    assert ck.save_once(4, 4, 0.5) == "run/checkpoints/step_000004/export" and saved == [4]
    # the closing lines name the export, or say that the model is the one loaded
    log = RunLogger("run", enabled=False, total_steps=0)
    assert "model        ckpts/step_000004/export  (HF format" in log.outputs("ckpts/step_000004/export", "in")
    assert "model        unchanged, no step ran: in" in log.outputs(None, "in")


def test_evaluator_is_due_every_k_steps_but_not_at_the_last():
    ev = Evaluator(_cfg("--steps", "10", "--eval.every", "5"), None, None, rank=0)
    assert [s for s in range(1, 11) if ev.due(s)] == [5]
    assert not any(Evaluator(_cfg("--eval.every", "0"), None, None, rank=0).due(s) for s in range(1, 9))


def test_no_before_train_skips_the_step_0_eval_and_reports_it_as_not_measured():
    assert Evaluator(_cfg("--eval.every", "5"), None, None, rank=0).at_start
    ev = Evaluator(_cfg("--eval.every", "5", "--eval.no-before-train"), None, None, rank=0)
    # no rollout here: evaluating would raise, so a NaN back means step 0 was skipped, not scored 0
    assert not ev.at_start and math.isnan(ev.initial(version=0))
    assert "eval accuracy not measured -> 0.250 (test" in ev.summary(float("nan"), 0.25)
    assert "eval accuracy 0.100 -> 0.250 (test" in ev.summary(0.1, 0.25)


@pytest.mark.parametrize(
    "old,new",
    [
        ("--probe.skip-sync", "--debug.skip-sync"),
        ("--dist.fail-rank", "--debug.fail-rank"),
        ("--dist.fail_step=2", "--debug.fail-step"),
    ],
)
def test_testing_only_flags_moved_under_debug(old, new):
    with pytest.raises(SystemExit, match=new):
        _cfg(old, *([] if "=" in old else ["1"]))
    cfg = _cfg("--debug.skip-sync", "--debug.fail-rank", "1", "--debug.fail-step", "2")
    assert (cfg.debug.skip_sync, cfg.debug.fail_rank, cfg.debug.fail_step) == (True, 1, 2)
    assert not hasattr(cfg.probe, "skip_sync") and not hasattr(cfg.dist, "fail_rank")


def test_replacing_a_builtin_name_logs_a_warning(caplog):
    import envs

    builtin = algos.get_policy_loss("cispo")
    try:
        with caplog.at_level(logging.WARNING):
            algos.register_policy_loss("cispo")(lambda *a, **k: None)
        assert "policy loss 'cispo': the built-in is replaced" in caplog.text
        caplog.clear()
        with caplog.at_level(logging.WARNING):  # a user's own name, registered again: no warning
            algos.register_policy_loss("test_user_twice")(lambda *a, **k: None)
            algos.register_policy_loss("test_user_twice")(lambda *a, **k: None)
        assert not caplog.text
        with caplog.at_level(logging.WARNING):
            envs.register_env("tool_use")(lambda split, seed, **kw: None)
        assert "env 'tool_use': the built-in" in caplog.text
    finally:
        algos.register_policy_loss("cispo", zero_at_zero_adv=True)(builtin)
        envs._REGISTRY.pop("tool_use", None)
    assert algos.get_policy_loss("cispo") is builtin and algos.registry.POLICY_LOSSES.meta("cispo")["zero_at_zero_adv"]


def test_packing_checked_at_build_falls_back_to_unpacked_rows(monkeypatch):
    """A model whose packed forward differs from its unpacked one trains unpacked (exact), with one line saying
    why; the check runs on every model that sees packed rows (policy, reference, critic). The decision is the plan's
    (nanosky/train/plan.py): the config is not written."""
    import copy

    from nanosky.train import packing, plan

    seen, lines = [], []

    def verify(model, forward, tol):
        seen.append(model)
        if model == "critic":
            raise packing.PackingUnsupported("packed and unpacked forwards differ by 0.5 (> 0.0001) on Critic")
        return 0.0

    monkeypatch.setattr(packing, "verify", verify)
    monkeypatch.setattr(packing, "lm_forward", lambda m: None)
    monkeypatch.setattr(plan, "critic_forward", lambda m: None)
    monkeypatch.setattr(plan.head, "installed", lambda m: False)
    cfg = _cfg("--optim.packed-attention", "mask")  # the dense mask's check, then unpacked (no grouped attempt)
    before = copy.deepcopy(cfg)
    p = plan.decide(cfg.optim, decide("fp32", "cpu"), "policy", ("ref",), "critic", say=lines.append)
    assert seen == ["policy", "ref", "critic"] and p.packing == "none" and p.attention is None
    assert cfg == before and p.optim(cfg.optim).packing == "none"  # the plan says what runs; cfg stays as parsed
    assert (
        lines
        == list(p.notes)
        == [
            "nanosky: packed and unpacked forwards differ by 0.5 (> 0.0001) on Critic; "
            "this run uses --optim.packing none (exact, slower)"
        ]
    )
    seen.clear()
    assert (
        plan.decide(p.optim(cfg.optim), decide("fp32", "cpu"), "policy", ("ref",), "critic", say=lines.append).packing
        == "none"
    )
    assert seen == []  # unpacked: nothing to check


def test_no_signal_warning_after_three_steps_in_a_row_and_once():
    from nanosky.metrics import NoSignalWatch

    w = NoSignalWatch()
    assert [w(1.0, 0.0), w(1.0, 0.0), w(0.5, 0.2), w(1.0, 0.0), w(None, 0.0)] == [None] * 5  # the streak resets
    assert w(1.0, 0.0) is None and w(1.0, 0.0) is None
    msg = w(1.0, 0.0)
    assert "3 steps in a row every group's rewards were equal" in msg and "--rollout.max-new-tokens" in msg
    assert w(1.0, 0.0) is None  # said once


def test_a_soft_capped_model_packs_under_the_dense_mask_and_says_so(tmp_path):
    """Gemma 2 trains on eager attention (soft-capping), which grouped attention does not cover: on CUDA (faked) the
    build check keeps it on the dense mask, says so in one line, and the plan records it (the config is not
    written)."""
    import copy

    from families import build
    from transformers import AutoModelForCausalLM

    from nanosky.train import grouped_attention, plan
    from nanosky.train.policy import attn_implementation

    path = build("gemma2", str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attn_implementation(path))
    cfg, lines = _cfg(), []
    before = copy.deepcopy(cfg)
    assert cfg.optim.grouped()  # auto: grouped
    p = plan.decide(cfg.optim, decide("auto", "cuda"), model, say=lines.append)
    assert not grouped_attention.enabled(model) and p.attention == "mask"
    assert p.packing == "prefix"  # packed, under the mask: the check passed on it
    assert cfg == before and not p.optim(cfg.optim).grouped()  # what the update runs: the mask
    assert lines == [
        "nanosky: gemma2 runs eager attention (soft-capped), which grouped attention does not cover; "
        "packed rows use the dense mask"
    ]


def test_a_model_grouped_attention_cannot_reproduce_falls_back_to_the_dense_mask(tmp_path, monkeypatch):
    """The grouped check failing (faked) sends packed rows to the dense mask, which is checked in turn: the plan is
    prefix-packed under the mask, grouped attention off on the model, and the config untouched."""
    import copy

    from families import build
    from transformers import AutoModelForCausalLM

    from nanosky.train import grouped_attention, packing, plan

    path = build("qwen2", str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    checked = []

    def verify(m, forward, tol):
        checked.append("grouped" if grouped_attention.enabled(m) else "mask")
        if grouped_attention.enabled(m):
            raise packing.PackingUnsupported("packed and unpacked forwards differ by 2.1 (> 0.1) on Qwen2ForCausalLM")
        return 0.0

    monkeypatch.setattr(packing, "verify", verify)
    cfg, lines = _cfg(), []
    before = copy.deepcopy(cfg)
    p = plan.decide(cfg.optim, decide("auto", "cuda"), model, say=lines.append)
    assert checked == ["grouped", "mask"] and (p.packing, p.attention) == ("prefix", "mask")
    assert not grouped_attention.enabled(model) and cfg == before
    assert lines == [
        "nanosky: packed and unpacked forwards differ by 2.1 (> 0.1) on Qwen2ForCausalLM with grouped "
        "attention; this run uses the dense mask"
    ]
