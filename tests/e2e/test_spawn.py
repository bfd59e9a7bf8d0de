"""The suite's launcher (spawn.torchrun's fork server): each rank sees torchrun's variables and its own output
stream, and a rank that fails ends the job at once, as torchrun ends it, not at the collective's timeout."""

import textwrap
import time

import pytest
from spawn import forked, python

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    rank = int(os.environ["RANK"])
    print(f"rank {rank} of {os.environ['WORLD_SIZE']} port {os.environ['MASTER_PORT']} argv {sys.argv[1:]}")
    print(f"err {rank}", file=sys.stderr)
    if sys.argv[1] == "fail" and rank == 1:
        sys.exit(3)
    if sys.argv[1] == "fail":
        time.sleep(600)  # a rank blocked in a collective with the dead one
    """
)


@pytest.mark.slow
def test_ranks_get_torchruns_variables_and_a_failed_rank_ends_the_job(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    r = forked(str(script), ["ok", "--x"], 2)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split(" port ")[0] for ln in lines] == ["rank 0 of 2", "rank 1 of 2"]
    assert lines[0].split(" port ")[1] == lines[1].split(" port ")[1]  # one rendezvous
    assert all(ln.endswith("argv ['ok', '--x']") for ln in lines)
    assert r.stderr.splitlines() == ["err 0", "err 1"]

    t0 = time.monotonic()
    r = forked(str(script), ["fail"], 2, timeout=120)
    assert r.returncode == 1 and "rank 0 of 2" in r.stdout
    assert time.monotonic() - t0 < 60  # rank 0 was stopped, not waited for


@pytest.mark.slow
def test_python_runs_one_process_without_launcher_variables(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(
        "import os, sys\nprint(sorted(k for k in ('RANK', 'WORLD_SIZE') if k in os.environ))\nsys.exit(2)\n"
    )
    r = python([], script=str(script))
    assert r.returncode == 2 and r.stdout.strip() == "[]"
