"""On-policy distillation in the same launch (issue 63): `run.py --algo distill --teacher.path PATH`. A teacher that
is the student gives no signal and changes no weight; the teacher's own held-out accuracy is measured at step 0 by
the run's engine, and the student's step-0 eval is its own; a different teacher (another model with the student's
tokenizer) distils into a LoRA student at 2 ranks on a multi-turn env, and the run resumes exactly."""

import math
import os
import shutil

from safetensors.torch import load_file, save_file
from spawn import scalars, torchrun

from nanosky.bundled import resolve_model_path

LORA = ["--lora.rank", "4", "--lora.alpha", "8", "--precision", "fp32", "--engine.kv-cache-gib", "0.25"]
TAGS = ("distill/reverse_kl", "train/pg_loss", "train/grad_norm", "train/reward_mean", "rollout/turns_mean")


def test_a_teacher_that_is_the_student_gives_no_signal_and_no_update(tmp_path):
    run = tmp_path / "self"
    args = ["--preset", "smoke", "--algo", "distill", "--teacher.path", "tiny", "--steps", "2", "--eval.limit", "4"]
    r = torchrun([*args, *LORA, "--log.run-dir", str(run)], nproc=1)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "nanosky: distill on math" in r.stdout
    s = scalars(str(run))
    assert [v for _, v in s["distill/reverse_kl"]] == [0.0, 0.0]  # the same forward, the same weights: exactly
    assert [v for _, v in s["train/skipped_rows_frac"]] == [1.0, 1.0]  # every advantage 0: no row trained
    assert [v for _, v in s["train/grad_norm"]] == [0.0, 0.0]
    base = load_file(os.path.join(resolve_model_path("tiny"), "model.safetensors"))
    final = load_file(str(run / "checkpoints" / "step_000002" / "export" / "model.safetensors"))
    assert base.keys() == final.keys() and all(base[k].equal(final[k]) for k in base)  # the merge added nothing
    # the teacher's held-out eval at step 0, in the run's engine: the student's own numbers, the same episodes
    evals = [t.removeprefix("eval/") for t in s if t.startswith("eval/")]
    assert evals and all(s[f"distill/teacher_{t}"] == [s[f"eval/{t}"][0]] for t in evals), s

    # another teacher of the student's shapes (its final norm zeroed: every logit 0, it samples uniformly) is
    # evaluated as itself, and the student's step-0 eval is still the student's: exactly the run above's
    uniform = tmp_path / "uniform"
    shutil.copytree(resolve_model_path("tiny"), uniform)
    save_file(base | {"model.norm.weight": base["model.norm.weight"] * 0}, str(uniform / "model.safetensors"))
    other = tmp_path / "other"
    args = [*args[:5], str(uniform), *args[6:]]
    r = torchrun([*args, *LORA, "--steps", "1", "--log.run-dir", str(other)], nproc=1)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    o = scalars(str(other))
    assert all(o[f"eval/{t}"][0] == s[f"eval/{t}"][0] for t in evals), (o, s)
    assert o["distill/teacher_accuracy"][0][1] == 0.0
    assert o["distill/teacher_response_len"][0][1] > s["eval/response_len"][0][1]  # uniform: rarely an end token


def test_a_teacher_distils_into_a_lora_student_on_a_multi_turn_env_at_2_ranks_and_resumes_exactly(tmp_path):
    # tool_use's model is tiny-tool; the teacher is the bundled tiny model, trained apart on the same tokenizer
    args = ["--preset", "tool_use", "--algo", "distill", "--teacher.path", "tiny", "--steps", "2"]
    args += ["--rollout.prompts-per-step", "4", "--rollout.group-size", "2", "--eval.every", "0", "--eval.limit", "2"]
    args += ["--envpool.workers", "1", "--log.ckpt-every", "1", "--log.samples-per-step", "100", *LORA]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    r = torchrun([*args, "--log.run-dir", str(straight)])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "the teacher's held-out accuracy is not computed in-run (num_attention_heads 8 (student) vs 4" in r.stdout
    a = scalars(str(straight))
    assert not any(t.startswith("distill/teacher_") for t in a)
    kl = [v for _, v in a["distill/reverse_kl"]]
    assert len(kl) == 2 and all(math.isfinite(v) and v > 0 for v in kl), kl  # two models: a gap to close
    assert all(v > 0 for _, v in a["train/grad_norm"]) and a["rollout/turns_mean"][0][1] > 1  # multi-turn rows
    r = torchrun([*args, "--log.run-dir", str(resumed), "--resume", str(straight / "checkpoints" / "step_000001")])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    b = scalars(str(resumed))
    for tag in TAGS:
        assert [st for st, _ in b[tag]] == [2] and b[tag][0] == a[tag][1], (tag, a[tag], b[tag])
