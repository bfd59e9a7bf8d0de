"""On-policy distillation in the same launch (issue 63): `run.py --algo distill --teacher.path PATH`. A teacher that
is the student gives no signal and changes no weight; a different teacher (another model with the student's
tokenizer) distils into a LoRA student at 2 ranks on a multi-turn env, and the run resumes exactly."""

import math
import os

from safetensors.torch import load_file
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


def test_a_teacher_distils_into_a_lora_student_on_a_multi_turn_env_at_2_ranks_and_resumes_exactly(tmp_path):
    # tool_use's model is tiny-tool; the teacher is the bundled tiny model, trained apart on the same tokenizer
    args = ["--preset", "tool_use", "--algo", "distill", "--teacher.path", "tiny", "--steps", "2"]
    args += ["--rollout.prompts-per-step", "4", "--rollout.group-size", "2", "--eval.every", "0", "--eval.limit", "2"]
    args += ["--envpool.workers", "1", "--log.ckpt-every", "1", "--log.samples-per-step", "100", *LORA]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    r = torchrun([*args, "--log.run-dir", str(straight)])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    a = scalars(str(straight))
    kl = [v for _, v in a["distill/reverse_kl"]]
    assert len(kl) == 2 and all(math.isfinite(v) and v > 0 for v in kl), kl  # two models: a gap to close
    assert all(v > 0 for _, v in a["train/grad_norm"]) and a["rollout/turns_mean"][0][1] > 1  # multi-turn rows
    r = torchrun([*args, "--log.run-dir", str(resumed), "--resume", str(straight / "checkpoints" / "step_000001")])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    b = scalars(str(resumed))
    for tag in TAGS:
        assert [st for st, _ in b[tag]] == [2] and b[tag][0] == a[tag][1], (tag, a[tag], b[tag])
