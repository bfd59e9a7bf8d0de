"""An ecosystem env's bad input is one line at start-up (nanosky/preflight/), before any model loads: a missing
file or column, an unknown class, task or game, a reward function that does not import, a missing extra."""

import json

import pytest

from envs.ecosystem import MissingExtra, require
from nanosky import bundled, preflight
from nanosky.cli import parse_args

pytest.importorskip("datasets", reason="the gyms extra (make test installs it)")
pd = pytest.importorskip("pandas")


def _check(*flags):
    cfg = parse_args(list(flags), console=False)
    preflight.check_env_data(cfg.env, cfg.env_data)
    preflight.check_ecosystem_env(cfg, bundled.resolve_model_path(cfg.model.path))


@pytest.fixture
def files(tmp_path):
    (tmp_path / "rows.jsonl").write_text(
        "".join(json.dumps({"text": f"t{i}", "gold": str(i)}) + "\n" for i in range(9))
    )
    pd.DataFrame(
        [
            {
                "prompt": [{"role": "user", "content": f"hi {i}"}],
                "env_class": "gsm8k",
                "reward_spec": {"ground_truth": "1"},
            }
            for i in range(4)
        ]
    ).to_parquet(tmp_path / "sk.parquet")
    (tmp_path / "same.jsonl").write_text(
        json.dumps({"question": "q?", "answer": "1"}) + "\n" * 1 + json.dumps({"question": "q?", "answer": "1"}) + "\n"
    )
    return tmp_path


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--env", "dataset"], "--env dataset needs a data file: --env-data FILE"),
        (["--env", "dataset", "--env-data", "/nope.parquet"], "--env-data /nope.parquet: no such file or folder"),
        (
            ["--env", "dataset", "--env-data", "{d}/rows.jsonl"],
            "--env dataset: {d}/rows.jsonl row 0: no prompt column (looked for prompt, question, problem, query, instruction; name yours with --env-kwargs.prompt-key); columns found: text, gold",
        ),
        (
            ["--env", "dataset", "--env-data", "{d}/rows.jsonl", "--env-kwargs.prompt-key", "text"],
            "--env dataset: {d}/rows.jsonl: no answer column for the math reward",
        ),
        (
            [
                "--env",
                "dataset",
                "--env-data",
                "{d}/rows.jsonl",
                "--env-kwargs.prompt-key",
                "text",
                "--env-kwargs.reward",
                "nope:fn",
            ],
            "--env dataset: reward 'nope:fn': no module named 'nope'",
        ),
        (
            ["--env", "dataset", "--env-data", "{d}/rows.jsonl", "--env-kwargs.promt-key", "text"],
            "unexpected keyword argument 'promt_key'",
        ),
        (
            ["--env", "skyrl_gym", "--env-data", "{d}/sk.parquet", "--env-kwargs.env-class", "nope"],
            "skyrl_gym: unknown env class 'nope'; registered: aime, ",
        ),
        (
            ["--env", "reasoning_gym", "--env-kwargs.tasks", "basic_arithmetc"],
            "reasoning_gym: unknown task 'basic_arithmetc'; valid: ab, acre",
        ),
        (
            ["--env", "textarena", "--env-kwargs.game", "Wordle-v0"],
            "textarena game 'Wordle-v0' needs an nltk download ('words')",
        ),
        (
            ["--env", "dataset", "--env-data", "{d}/same.jsonl"],
            "2 row(s) with 1 distinct prompt(s): a held-out split needs at least 2 (or pass --env-kwargs.test-data FILE)",
        ),
        (["--env", "textarena"], "textarena needs --env-kwargs.game ID"),
        (["--env", "reasoning_gym", "--env-data", "x.jsonl"], "--env-data: env 'reasoning_gym' takes no data file"),
    ],
)
def test_bad_input_is_one_line(files, flags, line):
    flags = [f.format(d=files) for f in flags]
    with pytest.raises(preflight.UsageError) as e:
        _check(*flags)
    msg = str(e.value)
    assert line.format(d=files) in msg and "\n" not in msg, msg


def test_good_input_passes(files):
    _check(
        "--env",
        "dataset",
        "--env-data",
        f"{files}/rows.jsonl",
        "--env-kwargs.prompt-key",
        "text",
        "--env-kwargs.answer-key",
        "gold",
    )
    _check("--env", "skyrl_gym", "--env-data", f"{files}/sk.parquet")
    _check("--env", "textarena", "--env-kwargs.game", "GuessTheNumber-v0")


def test_a_missing_package_names_the_extra():
    with pytest.raises(MissingExtra, match=r"not installed .* pip install 'nanosky\[gyms\]'"):
        require("no_such_gym_package")


def test_prompts_that_cannot_fit_are_refused_at_start_up(tmp_path):
    long = [{"question": "word " * 400 + f"{i}?", "answer": str(i)} for i in range(5)]
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in long))
    with pytest.raises(
        preflight.UsageError,
        match=r"none of the first 4 rows' prompts fits --rollout.max-total-tokens 160 \(the shortest takes \d+ tokens",
    ):
        _check("--env", "dataset", "--env-data", f"{tmp_path}/long.jsonl", "--rollout.max-total-tokens", "160")
    mixed = long + [{"question": f"short {i}?", "answer": str(i)} for i in range(20)]
    (tmp_path / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mixed))
    _check("--env", "dataset", "--env-data", f"{tmp_path}/mixed.jsonl", "--rollout.max-total-tokens", "160")
