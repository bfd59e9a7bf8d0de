"""The rollout viewer's data loading on bad input, in a real browser: a run killed mid-write (a truncated last line),
an empty run, and a 50 MB rollouts.jsonl. The page opens and says what it skipped. (The page a real run made is
tested in tests/e2e/test_presets_e2e.py, on the swe run.)"""

import json
import os
import random

import pytest
from browser import driver, open_page

from nanosky.view import write
from nanosky.view.data import MAX_BYTES, load


def _record(step: int, group: int, n_tokens: int, rng: random.Random) -> dict:
    ids = [rng.randrange(3, 1000) for _ in range(n_tokens)]
    mask = [0] * 8 + [1] * (n_tokens - 8)
    on = lambda f: [None if not m else round(f(), 4) for m in mask]  # noqa: E731
    return {
        "step": step,
        "split": "train",
        "group": group,
        "reward": round(rng.random(), 3),
        "success": False,
        "stop_reason": "done",
        "turns": 1,
        "task_id": f"math/train/{group}",
        "env_seed": group,
        "prompt_len": 8,
        "messages": [{"role": "user", "content": f"question {group}"}, {"role": "assistant", "content": "answer"}],
        "tokens": {
            "ids": ids,
            "mask": mask,
            "lp": on(lambda: -rng.random()),
            "lp_train": on(lambda: -rng.random()),
            "adv": on(lambda: 0.5),
            "ent": on(rng.random),
        },
    }


def _run(tmp_path, name: str, lines: list[str]) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "rollouts.jsonl").write_text("".join(lines))
    return str(d)


@pytest.fixture(scope="module")
def chrome():
    d = driver()
    yield d
    d.quit()


def test_a_truncated_last_line_is_skipped_and_said(tmp_path, chrome):
    rng = random.Random(0)
    recs = [_record(s, g, 30, rng) for s in (1, 2) for g in range(2)]
    evil = "</script><script>document.body.dataset.ready = 'hijacked'</script> <b>not bold</b>"
    recs[2]["messages"][1]["content"] = evil  # what a model may write: shown as text, never run
    lines = [json.dumps(r) + "\n" for r in recs]
    path = _run(tmp_path, "killed", lines + [lines[0][:57]])  # the run died mid-write
    data = load(path)
    assert len(data["records"]) == 4 and "the last line (truncated" in data["notes"][0]
    page = write(path)
    open_page(chrome, str(page))
    notes = [e.text for e in chrome.find_elements("css selector", "#notes li")]
    assert any("skipped 1 line" in n for n in notes)
    assert len(chrome.find_elements("css selector", "#steps tr[data-step]")) == 2
    # the newest step's first episode opens: the text is shown as text
    assert evil in chrome.find_element("css selector", "#turns").text
    assert chrome.find_elements("css selector", "#turns b") == []


def test_an_empty_run_opens_and_says_so(tmp_path, chrome):
    path = _run(tmp_path, "empty", [])
    open_page(chrome, str(write(path)))
    assert "no episodes recorded yet" in chrome.find_element("css selector", "#notes").text
    assert chrome.find_elements("css selector", "#steps tr[data-step]") == []


def test_a_50_mb_run_opens_within_the_page_budget(tmp_path, chrome):
    rng = random.Random(1)
    rec = [json.dumps(_record(s, g, 2100, rng)) + "\n" for s in range(1, 41) for g in range(16)]
    path = _run(tmp_path, "big", rec)
    size = os.path.getsize(os.path.join(path, "rollouts.jsonl"))
    assert size > 50e6
    page = write(path)
    assert os.path.getsize(page) < 1.2 * MAX_BYTES  # the embedded data is capped, the rest said in the notes
    seconds = open_page(chrome, str(page))
    notes = chrome.find_element("css selector", "#notes").text
    assert "shown without token values" in notes
    steps = len(chrome.find_elements("css selector", "#steps tr[data-step]"))
    assert steps == 40  # every step is still listed; the older ones lost their token values
    print(
        f"50 MB run: rollouts.jsonl {size / 1e6:.1f} MB, page {os.path.getsize(page) / 1e6:.1f} MB, "
        f"rendered in {seconds:.1f} s"
    )


def test_an_eval_folder_and_an_external_agents_episode(tmp_path, chrome):
    """An eval's output folder (examples.jsonl, no steps) opens; an external agent's episode shows its segments
    and calls, and a judged one the judge's score and explanation."""
    rng = random.Random(2)
    d = tmp_path / "eval-out"
    d.mkdir()
    recs = [_record(0, g, 20, rng) for g in range(3)]
    for r in recs:
        del r["step"], r["split"], r["tokens"]  # what evals write
    recs[0]["info"] = {
        "agent": {"segments": 2, "calls": 5, "rejected": 1, "versions": [3, 3]},
        "judge": {"score": 0.75, "explanation": "correct but terse"},
    }
    (d / "examples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "report.json").write_text(json.dumps({"eval": "math", "accuracy": 0.5}))
    data = load(str(d))
    assert data["kind"] == "eval" and {r["split"] for r in data["records"]} == {"eval"}
    open_page(chrome, str(write(str(d))))
    chrome.find_element("css selector", "#f-split").send_keys("eval")
    assert len(chrome.find_elements("css selector", ".card")) == 3
    chrome.find_elements("css selector", ".card")[0].click()
    assert "2 segment(s)" in chrome.find_element("css selector", "#turns .agent").text
    assert "5 calls" in chrome.find_element("css selector", ".card .agent").text
    assert chrome.find_element("css selector", "#turns .judge").text == "judge: 0.750, correct but terse"


def test_serve_rereads_a_running_run_and_answers_bad_paths_plainly(tmp_path):
    """--serve: the page on GET /, re-read when the run writes more; other paths and methods are 404 / 405 with a
    line of text; a run dir that disappears is a 404, never a 500."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from nanosky.view.server import app

    rng = random.Random(3)
    path = _run(tmp_path, "running", [json.dumps(_record(1, 0, 10, rng)) + "\n"])

    async def go():
        async with TestClient(TestServer(app(path, 25 << 20))) as c:
            r = await c.get("/")
            first = await r.text()
            assert r.status == 200 and "text/html" in r.headers["Content-Type"] and '"step": 1' in first
            with open(os.path.join(path, "rollouts.jsonl"), "a") as f:  # the run goes on
                f.write(json.dumps(_record(2, 0, 10, rng)) + "\n")
            os.utime(os.path.join(path, "rollouts.jsonl"), (1e10, 1e10))  # a change the clock's resolution sees
            assert '"step": 2' in await (await c.get("/")).text()
            assert (await c.get("/etc/passwd")).status == 404
            assert (await c.post("/", data=b"x")).status == 405
            for name in os.listdir(path):
                os.remove(os.path.join(path, name))
            os.rmdir(path)
            gone = await c.get("/")
            assert gone.status == 404 and "no such directory" in await gone.text()

    asyncio.run(go())


def test_the_header_names_the_algorithm_from_config_json(tmp_path):
    """config.json holds the algorithm as `algorithm.name` (dataclasses.asdict of TrainConfig), not `algo`."""
    path = _run(tmp_path, "run", [json.dumps(_record(1, 0, 12, random.Random(0))) + "\n"])
    config = {"env": "math", "seed": 3, "steps": 40, "algorithm": {"name": "dapo", "clip_high": 0.28}}
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    assert load(path)["config"] == {"env": "math", "algo": "dapo", "seed": 3, "steps": 40}


def test_a_run_with_nan_values_opens(tmp_path, chrome):
    """JSON has no NaN, and a run writes some (a success rate where no episode was checked, a reward a user's
    function returned): the page still parses and shows the episodes, the NaN as no value."""
    rng = random.Random(2)
    recs = [_record(1, g, 20, rng) for g in range(2)]
    recs[0]["reward"], recs[1]["tokens"]["lp"][-1] = float("nan"), float("nan")
    path = _run(tmp_path, "nan", [json.dumps(r) + "\n" for r in recs])
    open_page(chrome, str(write(path)))
    assert len(chrome.find_elements("css selector", "#steps tr[data-step]")) == 1
    assert len(chrome.find_elements("css selector", ".card")) == 2
