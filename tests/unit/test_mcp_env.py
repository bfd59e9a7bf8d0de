"""`--env mcp`: an MCP server's tools as an episode's tools, over stdio and streamable HTTP, with per-episode folders,
faults that cost one episode, and the SQLite shop task through the real `mcp-server-sqlite` (issue 73)."""

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

import envs
from envs.mcp import MCPEnv
from envs.mcp.client import ServerFault
from envs.mcp.shop import SPLITS, TEMPLATES, shop_folder
from nanosky.rollout.envpool import EnvFailure, EnvPool

TOY = os.path.join(os.path.dirname(__file__), "..", "scripts", "mcp_toy_server.py")
SERVER = f"{sys.executable} {TOY}"


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "q.jsonl"
    row = {"question": "What is 2 + 3?", "answer": "5", "calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}
    path.write_text(json.dumps(row) + "\n")
    return {"data_path": str(path), "test_data": str(path)}


def test_the_servers_tools_are_the_episodes_and_calls_run_there(rows):
    env = envs.make("mcp", "train", 0, server=SERVER, **rows)
    schemas = {t.name: t.schema["function"] for t in env.tools}
    assert {"add", "note", "fail"} <= set(schemas)
    assert (
        schemas["add"]["parameters"]["required"] == ["a", "b"] and schemas["add"]["description"] == "Add two integers."
    )
    assert env.reset()[1] == {"role": "user", "content": "What is 2 + 3?"}
    r = env.step(call("add", a=2, b=3))
    assert r.observations == [{"role": "tool", "name": "add", "content": "5"}] and not r.done
    r = env.step(call("fail", reason="no such row"))  # a tool's error is the model's to see, not a fault
    assert r.observations[0]["content"].startswith("Error:") and "no such row" in r.observations[0]["content"]
    r = env.step(call("add", a="x", b=1))  # bad arguments never reach the server
    assert "argument 'a' must be integer" in r.observations[0]["content"]
    r = env.step("It is 5.")  # no call: the episode ends, scored strict (the tag) and lenient
    assert r.done and r.reward == 0.0 and r.info["env_metrics"]["mcp/lenient"] == 1.0
    assert r.info["env_metrics"]["mcp/tool_calls"] == 3.0 and r.info["env_metrics"]["mcp/tool_errors"] == 2.0
    env = envs.make("mcp", "test", 0, server=SERVER, **rows)
    assert env.step("<answer>5</answer>").reward == 1.0
    assert envs.make("mcp", "test", 0, server=SERVER, reward="lenient", **rows).step("so 5").reward == 1.0


def test_an_episode_dir_gives_each_episode_a_copy_of_the_template_and_a_server_of_its_own(rows, tmp_path):
    template = tmp_path / "template"
    template.mkdir()
    (template / "notes.txt").write_text("from the template\n")
    kw = {"server": f"{SERVER} --folder {{episode_dir}}", "template": str(template), **rows}
    a, b = envs.make("mcp", "train", 0, **kw), envs.make("mcp", "train", 0, **kw)
    assert a.episode_dir != b.episode_dir
    assert a.step(call("note", text="a was here")).observations[0]["content"] == "from the template\na was here\n"
    assert b.step(call("note", text="b")).observations[0]["content"] == "from the template\nb\n"  # not a's write
    assert (template / "notes.txt").read_text() == "from the template\n"
    folder = a.episode_dir
    a.close()
    assert not os.path.exists(folder)
    b.close()


def test_reuse_server_keeps_the_server_for_the_next_episode_and_restores_its_folder(rows, tmp_path):
    template = tmp_path / "template"
    template.mkdir()
    (template / "notes.txt").write_text("from the template\n")
    kw = {"server": f"{SERVER} --folder {{episode_dir}}", "template": str(template), "reuse_server": True, **rows}
    a = envs.make("mcp", "train", 0, **kw)
    folder, server = a.episode_dir, a.own
    assert a.step(call("note", text="a was here")).observations[0]["content"] == "from the template\na was here\n"
    (tmp_path / "template" / "extra.txt").write_text("")  # the template as it is at restore time
    os.mkdir(os.path.join(folder, "scratch"))  # what the episode left behind goes
    a.close()
    assert sorted(os.listdir(folder)) == ["extra.txt", "notes.txt"]
    b = envs.make("mcp", "train", 1, **kw)
    assert (b.episode_dir, b.own) == (folder, server)  # no new process: the same server, its folder restored
    assert b.step(call("note", text="b")).observations[0]["content"] == "from the template\nb\n"  # not a's write
    c = envs.make("mcp", "train", 2, **kw)  # b is still running: c gets a server and folder of its own
    assert c.episode_dir != folder and c.own is not server
    with pytest.raises(ServerFault):  # a server that died is not kept
        b.step(call("die"))
    b.close()
    assert not os.path.exists(folder)
    d = envs.make("mcp", "train", 3, **kw)
    assert d.own is not server and d.step(call("add", a=1, b=2)).observations[0]["content"] == "3"
    c.close(), d.close()


def test_a_pool_workers_stop_closes_its_idle_servers_and_removes_their_folders(rows, tmp_path, monkeypatch):
    """The servers kept for reuse and their episode folders go with the pool: the worker's exit removes the folders
    before it closes the servers (the SDK's close can take seconds, and the pool kills a worker that lingers)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the worker's tempfile folder
    template = tmp_path / "template"
    template.mkdir()
    kw = {"server": f"{SERVER} --folder {{episode_dir}}", "template": str(template), "reuse_server": True, **rows}
    with EnvPool(n_workers=1, step_timeout_s=30) as pool:
        handles = [pool.make("mcp", "train", s, **kw) for s in range(2)]
        pool.reset(handles)
        out = pool.step([(h, call("add", a=1, b=s)) for s, h in enumerate(handles)])
        assert [o.observations[0]["content"] for o in out] == ["1", "2"]
        for h in handles:
            pool.close(h)  # both servers now idle, kept for the next episodes
        pool.make("mcp", "train", 0, server=SERVER, **rows)  # one worker runs its ops in order: after the closes
        assert len(os.listdir(tmp)) == 2
    assert os.listdir(tmp) == []


@pytest.mark.parametrize("fault", ["hang", "die", "garble"])
def test_a_server_that_hangs_dies_or_garbles_costs_the_episode_and_the_next_gets_a_new_one(rows, fault):
    env = envs.make("mcp", "train", 0, server=SERVER, call_timeout_s=1.0, **rows)
    dead, start = env.server, time.monotonic()
    with pytest.raises(ServerFault, match=f"{fault} failed"):
        env.step(call(fault))
    assert time.monotonic() - start < 10
    nxt = envs.make("mcp", "train", 0, server=SERVER, call_timeout_s=1.0, **rows)
    assert dead.broken and nxt.server is not dead and nxt.step(call("add", a=1, b=1)).observations[0]["content"] == "2"


def test_through_the_env_pool_a_dead_server_loses_its_trajectory_only(rows):
    with EnvPool(n_workers=1, step_timeout_s=30) as pool:
        handles = [pool.make("mcp", "train", 0, server=SERVER, call_timeout_s=2.0, **rows) for _ in range(3)]
        assert pool.tools(handles[0])[0]["function"]["name"] == "add"
        pool.reset(handles)
        out = pool.step([(handles[0], call("add", a=2, b=2)), (handles[1], call("die"))])
        assert out[0].observations[0]["content"] == "4"
        assert isinstance(out[1], EnvFailure) and "die failed" in out[1].reason
        [after] = pool.step([(handles[2], call("add", a=3, b=3))])
        assert after.observations[0]["content"] == "6" and pool.stats["failed"] == 1


def test_a_server_given_by_url_over_streamable_http(rows):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, TOY, "--http", str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "the toy HTTP server did not start"
                time.sleep(0.2)
        env = envs.make("mcp", "train", 0, server_url=f"http://127.0.0.1:{port}/mcp", **rows)
        assert env.step(call("add", a=20, b=22)).observations[0]["content"] == "42"
    finally:
        proc.kill()
        proc.wait()


def test_bad_configurations_are_one_line(rows):
    with pytest.raises(ValueError, match="needs its tasks: --env-data FILE"):
        MCPEnv(server=SERVER)
    with pytest.raises(ValueError, match="one of --env-kwargs.server"):
        MCPEnv(data_path=rows["data_path"])
    with pytest.raises(ValueError, match="reward 'exact'; valid: answer, lenient, math or MODULE:FN"):
        MCPEnv(server=SERVER, reward="exact", **rows)
    with pytest.raises(ValueError, match="'no-such-mcp-server' is not on PATH, beside .* nor in .*mcp-servers"):
        MCPEnv(server="no-such-mcp-server --db x", **rows)
    assert [t.name for t in MCPEnv(server=SERVER, tools="fail, add", **rows).tools] == ["fail", "add"]
    with pytest.raises(ValueError, match="the server has no tool 'sub'; it has add, note, fail"):
        MCPEnv(server=SERVER, tools="add,sub", **rows)
    with pytest.raises(ValueError, match="validation split needs --env-kwargs.validation-data"):
        MCPEnv(split="validation", server=SERVER, **rows)


# ------------------------------------------------------------------------------------ the SQLite shop (mcp_sqlite)


def test_shop_questions_are_held_out_by_template_and_entity_and_their_answers_are_the_sqls():
    folder = shop_folder()
    rows = {s: [json.loads(x) for x in open(os.path.join(folder, f"{s}.jsonl"))] for s in SPLITS}
    assert {s: {r["template"] for r in rs} for s, rs in rows.items()} == {
        s: {t[0] for t in TEMPLATES if t[1] == s} for s in SPLITS
    }
    named = {s: {r["calls"][0]["arguments"]["query"].split("'")[1] for r in rs} for s, rs in rows.items()}
    assert not named["train"] & named["test"] and not named["validation"] & (named["train"] | named["test"])
    assert len(rows["test"]) >= 40 and len(rows["validation"]) >= 40
    with sqlite3.connect(os.path.join(folder, "shop.db")) as db:
        for rs in rows.values():
            for r in rs:
                [(value,)] = db.execute(r["calls"][0]["arguments"]["query"]).fetchall()
                assert str(value) == r["answer"]


def test_shop_expert_solves_its_episodes_through_mcp_server_sqlite_each_on_its_own_database():
    for seed in range(4):
        env = envs.make("mcp_sqlite", "train", seed)
        assert "orders(id, person_id" in env.reset()[0]["content"]
        assert {"read_query", "write_query", "list_tables"} <= {t.name for t in env.tools}
        r = env.step(call("write_query", query="DELETE FROM orders"))  # this episode's copy only
        assert "affected_rows" in r.observations[0]["content"]
        env.close()
        env = envs.make("mcp_sqlite", "train", seed)
        while not env.done:
            r = env.step(env.expert_action())
        assert r.reward == 1.0 and r.info["success"] and r.info["tool_calls"] == 1, r.info
        env.close()


def test_shop_servers_are_reused_with_their_database_restored_unless_the_memo_tool_is_offered():
    assert envs.make("mcp_sqlite", "train", 0).reuse is None  # append_insight offered: its memo is server memory
    kw = {"tools": "read_query,write_query"}
    env = envs.make("mcp_sqlite", "train", 0, **kw)
    server = env.own
    assert "affected_rows" in env.step(call("write_query", query="DELETE FROM orders")).observations[0]["content"]
    env.close()
    env = envs.make("mcp_sqlite", "train", 0, **kw)
    assert env.own is server  # the same process, on the restored database: the deleted orders are back
    assert env.step(call("read_query", query="SELECT COUNT(*) AS n FROM orders")).observations[0]["content"] == (
        "[{'n': 400}]"
    )
    env.close()
