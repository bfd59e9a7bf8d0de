"""evals.swebench: the shipped mini suite, local grading (gold -> all resolved, empty -> none, partial fixes per
SWE-bench's rule, patch-apply fallbacks), bad rows, the agent env's tools, an oracle agent through the --base-url
path, and (slow) the agent end to end on the bundled tiny model with in-process vLLM."""

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from envs.swe import harness, patch_edits
from envs.swe.env import SWEEnv
from envs.swe.suite import build_suite
from evals import swebench
from evals.scripted import ScriptedServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("swe_cache"))


@pytest.fixture(scope="module")
def instances(cache):
    insts, bad = swebench.load_instances(None, cache_dir=cache)
    assert not bad
    return {i["instance_id"]: i for i in insts}


def _edit_and_diff(inst: dict, tmp_path: Path, edits: list[tuple[str, str, str]]) -> str:
    """A model patch made the real way: check out the base, edit files, `git diff`."""
    wd = str(tmp_path / "wd")
    harness.checkout(inst["local_repo"], inst["base_commit"], wd)
    for path, old, new in edits:
        p = Path(wd, path)
        assert p.read_text().count(old) == 1, (path, old)
        p.write_text(p.read_text().replace(old, new))
    return harness.diff_against(wd, inst["base_commit"])


def test_suite_is_deterministic_and_well_formed(cache, instances, tmp_path):
    again = build_suite(tmp_path / "other_cache")
    assert {r["instance_id"]: r["base_commit"] for r in again} == {i: x["base_commit"] for i, x in instances.items()}
    assert len(instances) >= 20 and len({x["repo"] for x in instances.values()}) >= 5
    for inst in instances.values():
        assert inst["FAIL_TO_PASS"] and inst["problem_statement"].strip() and inst["version"]
        assert set(inst["FAIL_TO_PASS"]).isdisjoint(inst["PASS_TO_PASS"])
    # the agent's checkout holds the base commit only: the fix is not somewhere in its history
    inst = instances["nanosky-mini__textkit-4"]
    wd = str(tmp_path / "wd")
    harness.checkout(inst["local_repo"], inst["base_commit"], wd)
    log = subprocess.run(["git", "-C", wd, "log", "--all", "--format=%H"], capture_output=True, text=True).stdout
    assert log.split() == [inst["base_commit"]]
    assert "return text[:width] + suffix" in Path(wd, "textkit/wrap.py").read_text()  # the bug is there


def test_gold_resolves_all_and_empty_resolves_none(cache, instances, tmp_path):
    gold = swebench.main(["--predictions", "gold", "--cache-dir", cache, "--out", str(tmp_path / "gold")])
    assert gold["resolved_rate"] == 1.0 and gold["resolved_ids"] == sorted(instances)
    assert gold["error_instances"] == 0 and gold["resolutions"]["RESOLVED_FULL"] == len(instances)
    preds = [json.loads(x) for x in (tmp_path / "gold" / "predictions.jsonl").read_text().splitlines()]
    assert {p["instance_id"]: p["model_patch"] for p in preds} == {i: x["patch"] for i, x in instances.items()}
    assert all(p["model_name_or_path"] == "gold" for p in preds)

    empty = swebench.main(["--predictions", "empty", "--cache-dir", cache, "--out", str(tmp_path / "empty")])
    assert empty["resolved_rate"] == 0.0 and empty["resolved_ids"] == []
    assert empty["empty_patch_ids"] == sorted(instances)


def test_partial_fix_is_partial_and_a_regression_is_no(instances, tmp_path):
    inst = instances["nanosky-mini__textkit-4"]  # truncate: two FAIL_TO_PASS tests
    only_bound = _edit_and_diff(inst, tmp_path / "a", [("textkit/wrap.py", "len(text) < width", "len(text) <= width")])
    r = harness.evaluate_instance(inst, only_bound)
    assert r["resolution"] == harness.PARTIAL and not r["resolved"]
    assert r["tests_status"]["FAIL_TO_PASS"]["success"] == ["tests/test_wrap.py::test_truncate_exact_width_unchanged"]
    assert not r["tests_status"]["PASS_TO_PASS"]["failure"]

    wd_gold_plus_break = _edit_and_diff(
        inst,
        tmp_path / "b",
        [
            (
                "textkit/wrap.py",
                "    if len(text) < width:\n        return text\n    return text[:width] + suffix",
                "    if len(text) <= width:\n        return text\n    return text[: width - len(suffix)].rstrip() + suffix",
            ),
            ("textkit/wrap.py", "    return lines", "    return []"),
        ],
    )
    r = harness.evaluate_instance(inst, wd_gold_plus_break)
    assert not r["tests_status"]["FAIL_TO_PASS"]["failure"]  # every target test passes...
    assert r["tests_status"]["PASS_TO_PASS"]["failure"] and r["resolution"] == harness.NO  # ...but wrap broke

    readme_only = _edit_and_diff(inst, tmp_path / "c", [("README.md", "Small", "Tiny")])
    r = harness.evaluate_instance(inst, readme_only)
    assert r["patch_applied"] and r["resolution"] == harness.NO


@pytest.mark.parametrize(
    "f2p_ok, p2p_ok, expected",
    [
        ((1, 1), (1, 1), "RESOLVED_FULL"),
        ((1, 0), (1, 1), "RESOLVED_PARTIAL"),
        ((0, 0), (1, 1), "RESOLVED_NO"),
        ((1, 1), (1, 0), "RESOLVED_NO"),
        ((1, 0), (0, 1), "RESOLVED_NO"),
        ((), (), "RESOLVED_FULL"),
    ],
)
def test_grade_rule(f2p_ok, p2p_ok, expected):
    f2p = [f"f{i}" for i in range(len(f2p_ok))]
    p2p = [f"p{i}" for i in range(len(p2p_ok))]
    status = {t: "PASSED" if ok else "FAILED" for t, ok in zip(f2p + p2p, f2p_ok + p2p_ok)}
    assert harness.grade(f2p, p2p, status)["resolution"] == expected


def test_grade_counts_missing_and_xfail():
    g = harness.grade(["a", "b"], ["c"], {"a": "XFAIL", "c": "PASSED"})  # "b" never ran
    assert g["resolution"] == harness.PARTIAL and g["tests_status"]["FAIL_TO_PASS"]["failure"] == ["b"]


def test_parse_pytest_log():
    log = """
PASSED tests/test_a.py::test_one
FAILED tests/test_a.py::test_two - AssertionError: assert 1 == 2
PASSED tests/test_a.py::test_three[1-2]
ERROR tests/test_a.py::test_three[1-2] - RuntimeError: teardown
SKIPPED [1] tests/test_a.py:9: later
XFAIL tests/test_a.py::test_four - known
"""
    assert harness.parse_pytest_log(log) == {
        "tests/test_a.py::test_one": "PASSED",
        "tests/test_a.py::test_two": "FAILED",
        "tests/test_a.py::test_three[1-2]": "ERROR",
        "tests/test_a.py::test_four": "XFAIL",
    }


def test_patch_apply_fallbacks(instances):
    inst = instances["nanosky-mini__textkit-4"]
    # No index line (so no --3way) and a stale first context line: only `patch --fuzz` applies it.
    fuzzy = re.sub(r"^index .*\n", "", inst["patch"], flags=re.MULTILINE)
    fuzzy = fuzzy.replace(
        ' def truncate(text: str, width: int, suffix: str = "...") -> str:',
        " def truncate(text, width, suffix):",
    )
    r = harness.evaluate_instance(inst, fuzzy)
    assert r["apply_method"] == "patch --fuzz" and r["resolved"]
    r = harness.evaluate_instance(
        inst, "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n"
    )
    assert not r["patch_applied"] and r["error"] == "patch did not apply" and not r["resolved"]


def test_bad_rows_tarballs_and_instances_without_repo(instances, tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "TAR_CACHE", tmp_path / "tar_cache")
    a, b = instances["nanosky-mini__statlib-2"], instances["nanosky-mini__timekit-3"]
    tar = tmp_path / "timekit.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        tf.add(b["local_repo"], arcname="timekit.git")
    rows = [
        {**a, "local_repo": os.path.relpath(a["local_repo"], tmp_path)},  # relative to the instances file
        {**b, "local_repo": str(tar)},
        {**a, "instance_id": "x__missing-1", "test_patch": None},
        {**a, "instance_id": "x__norepo-1", "local_repo": str(tmp_path / "nowhere")},
        {**a, "instance_id": "x__official-1", "local_repo": None},
        {**a},  # duplicate id
    ]
    inst_file = tmp_path / "instances.jsonl"
    inst_file.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    pred_file = tmp_path / "preds.jsonl"
    pred_file.write_text(
        "".join(
            json.dumps(p) + "\n"
            for p in [
                {"instance_id": a["instance_id"], "model_name_or_path": "m", "model_patch": a["patch"]},
                {"instance_id": b["instance_id"], "model_name_or_path": "m", "model_patch": b["patch"]},
                {"instance_id": "x__official-1", "model_name_or_path": "m", "model_patch": a["patch"]},
                {"instance_id": "x__junk", "model_patch": 42},
            ]
        )
    )
    out = tmp_path / "out"
    report = swebench.main(["--predictions", str(pred_file), "--instances", str(inst_file), "--out", str(out)])
    assert report["resolved_ids"] == sorted([a["instance_id"], b["instance_id"]])
    assert report["not_evaluated_ids"] == ["x__official-1"] and "local_repo" in report["official_harness"]
    assert report["total_instances"] == 3 and report["model"] == "m"
    skipped = {b_.get("id") or b_["line"]: b_["error"] for b_ in report["bad_rows"]}
    assert "missing field(s): test_patch" in skipped["x__missing-1"]
    assert "nowhere" in skipped["x__norepo-1"] and "duplicate" in skipped[a["instance_id"]]
    assert "invalid JSON" in skipped[7] and "model_patch" in skipped["x__junk"]
    lines = (out / "examples.jsonl").read_text().splitlines()
    assert len(lines) == 2 + len(report["bad_rows"])


def test_env_tools_stay_in_the_repo(instances, request):
    """The eval env uses the shared bash and str_replace_editor tools, confined to the checkout (.git included)."""
    env = SWEEnv(instances["nanosky-mini__textkit-4"], max_turns=5, obs_chars=400)
    request.addfinalizer(env.finish)  # the work tree goes even if an assert fails
    msgs = env.reset()
    assert "truncate" in msgs[1]["content"] and [t.name for t in env.tools] == [
        "bash",
        "str_replace_editor",
        "submit",
    ]
    call = lambda name, **args: json.dumps({"name": name, "arguments": args})  # noqa: E731
    ed = lambda **args: f"<tool_call>{call('str_replace_editor', **args)}</tool_call>"  # noqa: E731
    res = env.step(ed(command="view", path=".") + ed(command="view", path="textkit/wrap.py", view_range=[3, 3]))
    listing, source = (o["content"] for o in res.observations)
    assert listing.split() == [
        "./",
        "tests/",
        "textkit/",
        "README.md",
        "tests/test_case.py",
        "tests/test_slug.py",
        "tests/test_wrap.py",
        "textkit/__init__.py",
        "textkit/case.py",
        "textkit/slug.py",
        "textkit/wrap.py",
    ]
    assert source == "     3\t    if len(text) < width:"
    res = env.step(
        ed(command="create", path="../../etc/passwd", file_text="x")
        + ed(command="view", path=".git/config")
        + ed(command="str_replace", path="textkit/wrap.py", old_str="nope", new_str="x")
    )
    assert all(o["content"].startswith("Error:") for o in res.observations) and res.info["invalid_calls"] == 3
    res = env.step(
        ed(command="str_replace", path="textkit/wrap.py", old_str="len(text) < width", new_str="len(text) <= width")
        + f"<tool_call>{call('bash', command='python -m pytest -q tests/test_wrap.py 2>&1 | tail -1; touch /etc/x')}</tool_call>"
    )
    edited, shell = (o["content"] for o in res.observations)
    assert edited.startswith("edited textkit/wrap.py") and "passed" in shell and "exit code" in shell
    res = env.step(f"<tool_call>{call('submit')}</tool_call>")
    assert res.done and res.info["submitted"] and res.reward == 0.0  # the eval grades after the episode
    patch = env.finish()
    assert "+    if len(text) <= width:" in patch and env.workdir is None
    assert not os.path.exists("/etc/x")


def _edits_from_patch(patch: str) -> list[dict]:
    """The editor calls that reproduce a patch, one per hunk."""
    return [{"name": "str_replace_editor", "arguments": e} for e in patch_edits(patch)]


def test_oracle_agent_through_base_url(instances, tmp_path):
    """A scripted agent that writes the gold fix with the edit tool, then submits; one that only submits."""
    picked = [instances[i] for i in ("nanosky-mini__textkit-4", "nanosky-mini__cartlib-4", "nanosky-mini__csvlite-2")]
    inst_file = tmp_path / "instances.jsonl"
    inst_file.write_text("".join(json.dumps(i) + "\n" for i in picked))
    lazy = picked[2]["problem_statement"].splitlines()[0]

    def reply(messages):
        issue = messages[1]["content"]
        if len(messages) > 2 or issue.startswith(lazy):
            return '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
        inst = next(i for i in picked if issue.startswith(i["problem_statement"].splitlines()[0]))
        return "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in _edits_from_patch(inst["patch"]))

    with ScriptedServer(reply) as url:
        report = swebench.main(["--base-url", url, "--instances", str(inst_file), "--out", str(tmp_path / "out")])
    assert report["resolved_ids"] == sorted(i["instance_id"] for i in picked[:2])
    assert report["empty_patch_ids"] == [picked[2]["instance_id"]] and report["resolved_rate"] == pytest.approx(2 / 3)
    assert report["mean_steps"] == pytest.approx(5 / 3) and report["tool_calls_per_example"] == pytest.approx(5 / 3)
    assert report["stop_reasons"] == {"done": 3} and report["prompt_tokens"] > 0


@pytest.mark.slow
def test_agent_end_to_end_with_the_tiny_model(tmp_path):
    """`python -m evals.swebench --ckpt <bundled tiny-swe model> --limit 2`: vLLM in-process on CPU, agent, grading.
    tiny-swe, not the base model: the tools' schemas alone fill most of the base model's 512 positions."""
    from nanosky.tiny import SWE_DIR

    out, run = tmp_path / "out", tmp_path / "run"  # --ckpt takes a run dir: its latest checkpoint's export/
    (run / "checkpoints" / "step_000003").mkdir(parents=True)
    (run / "checkpoints" / "step_000003" / "export").symlink_to(SWE_DIR)
    (run / "checkpoints" / "latest").write_text("step_000003")
    cmd = [
        sys.executable,
        "-m",
        "evals.swebench",
        "--ckpt",
        str(run),
        "--limit",
        "2",
        "--max-steps",
        "2",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--out",
        str(out),
    ]
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher}  # a fresh world of one, not the test's group
    env |= {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["n_examples"] == 2 and report["total_instances"] == 2 and report["completion_tokens"] > 0
    assert 1 <= report["mean_steps"] <= 2 and sum(report["stop_reasons"].values()) == 2
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 2
    assert "swebench: resolved_rate" in r.stdout
    # vLLM's lines went to the eval's engine.log, not the console
    assert not re.search(r"pid=\d+\) (INFO|WARNING) ", r.stdout + r.stderr), r.stderr[-3000:]
    assert "Initializing a V1 LLM engine" in (out / "engine.log").read_text()
