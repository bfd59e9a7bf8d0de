"""`envs.make("swe")`: generated bug-fix tasks (envs/swe/generate.py) are real (FAIL_TO_PASS fails on the bug and
everything passes after the gold patch, on 200 seeds of every level), reproducible, split into unseen train / test
bugs, graded by the SWE harness, and solved by the scripted expert."""

import collections
import sys
import types
from pathlib import Path

import pytest

import envs
from envs.base import run_policy
from envs.swe import generate, harness, to_instance
from envs.swe.generate import KINDS, LEVELS, REPOSITORIES, _held_out, mutations
from envs.swe.templates import THEMES


def _run_tests(task, files: dict[str, str], test_files: dict[str, str]) -> dict[str, bool]:
    """test id -> passed, running every test function of `test_files` against the package in `files`, in-process
    (each module exec'd into a fresh module object; nothing touches the disk)."""
    saved = {k: v for k, v in sys.modules.items() if k == task.package or k.startswith(task.package + ".")}
    try:
        pkg = types.ModuleType(task.package)
        pkg.__path__ = []
        sys.modules[task.package] = pkg
        for path, text in sorted(files.items()):
            if path.startswith(task.package + "/") and path.endswith(".py") and not path.endswith("__init__.py"):
                name = path[:-3].replace("/", ".")
                mod = types.ModuleType(name)
                exec(compile(text, path, "exec"), mod.__dict__)
                sys.modules[name] = mod
        out = {}
        for path, text in test_files.items():
            ns: dict = {}
            exec(compile(text, path, "exec"), ns)
            for name, fn in ns.items():
                if name.startswith("test_"):
                    try:
                        fn()
                        out[f"{path}::{name}"] = True
                    except Exception:  # noqa: BLE001
                        out[f"{path}::{name}"] = False
        return out
    finally:
        for k in [k for k in sys.modules if k == task.package or k.startswith(task.package + ".")]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.mark.parametrize("level", LEVELS)
def test_fail_to_pass_fails_on_the_bug_and_all_pass_after_the_gold_patch_on_200_seeds(level):
    kinds = collections.Counter()
    for split, seeds in (("train", range(200)), ("test", range(50))):
        for seed in seeds:
            task = generate(seed, level, split)
            visible = {p: t for p, t in task.files.items() if p.startswith("tests/")}
            all_tests = {**visible, **task.test_files}
            before = _run_tests(task, task.files, all_tests)
            after = _run_tests(task, task.fixed_files, all_tests)
            where = f"{task.instance_id}: {task.bug}"
            assert task.fail_to_pass and set(before) == set(task.fail_to_pass) | set(task.pass_to_pass), where
            assert not any(before[t] for t in task.fail_to_pass), where  # every FAIL_TO_PASS fails on the bug
            assert all(before[t] for t in task.pass_to_pass), where
            assert all(after.values()), where  # and everything passes after the fix
            assert _run_tests(task, task.files, visible) == {t: True for t in task.pass_to_pass}  # repo's tests pass
            kinds[task.bug["kind"]] += 1
            fixed_lines = set(task.fixed_files[task.bug["path"]].splitlines()) - set(
                task.files[task.bug["path"]].splitlines()
            )
            assert not any(ln.strip() in task.problem_statement for ln in fixed_lines if ln.strip()), where
            n_modules = sum(p.startswith(task.package + "/") and "__init__" not in p for p in task.files)
            assert n_modules == (1 if level == 1 else 3)
    assert set(kinds) == set(KINDS)  # every bug kind is drawn


def test_statements_get_vaguer_with_the_level():
    t1, t2, t3 = (generate(4, lv) for lv in LEVELS)
    assert t1.bug["path"] in t1.problem_statement and "Expected" in t1.problem_statement
    assert t2.bug["path"] not in t2.problem_statement and "should return" in t2.problem_statement
    assert t3.bug["path"] not in t3.problem_statement and "should" not in t3.problem_statement
    for t in (t1, t2, t3):
        assert t.bug["function"] in t.problem_statement


def test_generation_is_deterministic_and_splits_hold_different_bugs(tmp_path):
    a, b = generate(9, 2, "train"), generate(9, 2, "train")
    assert a == b and a.instance_id == "nanosky-gen__" + a.package + "-L2-train9"
    assert generate(9, 2, "test") != a and generate(10, 2, "train") != a
    # the base commit is the same in any cache (fixed author, date and file modes)
    assert to_instance(a, tmp_path / "x")["base_commit"] == to_instance(b, tmp_path / "y")["base_commit"]
    for fns in THEMES.values():
        for fn in fns:
            sites = mutations(fn.source)
            assert sites, fn.name
            held = [m for m in sites if _held_out(fn.name, m)]
            assert len(held) < len(sites)  # every function can be trained on
    bug = lambda t: (t.bug["function"], t.bug["kind"], t.bug["site"])  # noqa: E731
    train = {bug(generate(s, lv)) for lv in LEVELS for s in range(150)}
    test = {bug(generate(s, lv, "test")) for lv in LEVELS for s in range(150)}
    assert len(train) > 100 and len(test) > 30 and not train & test  # held-out bugs are never trained on
    # many bugs per repository (as in SWE-smith), and none of the shipped suite's repositories is generated
    shipped = {p.name for p in (Path(envs.__file__).parents[1] / "envs/data/swe_mini/repos").iterdir()}
    packages = {generate(s, lv).package for lv in LEVELS for s in range(60)}
    assert packages == set(REPOSITORIES.values()) and len(shipped) == 6 and not packages & shipped
    with pytest.raises(ValueError, match="level"):
        generate(0, 4)
    with pytest.raises(ValueError, match="split"):
        generate(0, 1, "dev")


def test_harness_grades_a_generated_instance(tmp_path):
    """Through git, the sandbox and pytest: FAIL_TO_PASS fails on base + test patch; the gold patch resolves, an
    empty patch does not."""
    for level in LEVELS:
        inst = harness.normalize_instance(to_instance(generate(21, level), tmp_path))
        work = tmp_path / f"w{level}"
        harness.checkout(inst["local_repo"], inst["base_commit"], str(work))
        assert harness.apply_patch(str(work), inst["test_patch"])[0]
        status, _ = harness.run_tests(str(work), harness.test_files(inst))
        assert all(status[t] == "FAILED" for t in inst["FAIL_TO_PASS"])
        assert all(status[t] == "PASSED" for t in inst["PASS_TO_PASS"])
        assert harness.evaluate_instance(inst, inst["patch"])["resolved"]
        assert harness.evaluate_instance(inst, "")["resolution"] == harness.NO


def test_env_expert_resolves_and_an_empty_submit_does_not():
    def make(split, **kw):
        def build(seed):
            env = envs.make("swe", split, seed, **kw)
            env.reset()
            return env

        return build

    for split, kw, seeds in (
        ("train", {"level": "[1, 2, 3]"}, range(3)),
        ("test", {}, [0, 13]),
        ("test", {"test_suite": "generated"}, [5]),
    ):
        r = run_policy(make(split, **kw), lambda e: e.expert_action(), seeds)
        assert r["success_rate"] == 1.0 and r["mean_reward"] == 1.0, (split, kw, r)
    empty = run_policy(
        make("train", level=1), lambda e: '<tool_call>{"name": "submit", "arguments": {}}</tool_call>', range(2)
    )
    assert empty == {"episodes": 2, "mean_reward": 0.0, "success_rate": 0.0, "mean_steps": 1.0}


def test_env_instance_fields_reward_rule_and_bad_kwargs(monkeypatch):
    env = envs.make("swe", "train", 2, level=1, partial_credit=True)
    inst = env.instance
    assert {
        "instance_id",
        "repo",
        "base_commit",
        "problem_statement",
        "patch",
        "test_patch",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
        "local_repo",
    } <= set(inst) and isinstance(inst["FAIL_TO_PASS"], list)
    msgs = env.reset()
    assert msgs[1]["content"] == inst["problem_statement"].strip()
    assert [t.name for t in env.tools] == ["bash", "str_replace_editor", "submit"]

    def verdict(f2p_ok: int, p2p_broken: bool):
        status = {
            "FAIL_TO_PASS": {"success": ["a"] * f2p_ok, "failure": ["b"] * (4 - f2p_ok)},
            "PASS_TO_PASS": {"success": [], "failure": ["c"] if p2p_broken else []},
        }
        full = f2p_ok == 4 and not p2p_broken
        return lambda *a, **k: {
            "resolved": full,
            "resolution": harness.FULL if full else harness.PARTIAL,
            "patch_applied": True,
            "empty_patch": False,
            "tests_status": status,
        }

    # partial credit: the fraction of FAIL_TO_PASS that pass, only when no PASS_TO_PASS test broke
    for f2p_ok, broken, want in ((4, False, 1.0), (1, False, 0.25), (3, True, 0.0), (0, False, 0.0)):
        monkeypatch.setattr(harness, "evaluate_instance", verdict(f2p_ok, broken))
        env.reset()
        res = env.step('<tool_call>{"name": "submit", "arguments": {}}</tool_call>')
        assert res.done and res.reward == want
        env.partial_credit = False
        env.reset()
        assert env.step('<tool_call>{"name": "submit", "arguments": {}}</tool_call>').reward == float(want == 1.0)
        env.partial_credit = True
    with pytest.raises(ValueError, match="level"):
        envs.make("swe", "train", 0, level=5)
    with pytest.raises(ValueError, match="test_suite"):
        envs.make("swe", "test", 0, test_suite="verified")
