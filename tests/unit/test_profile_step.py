"""`--log.profile-step`: the phase it names is traced (the others are not), and bench/profile_step.py's breakdown puts
each operator's self time in its part: a matmul under the head's range is the head's, one outside it a matmul."""

import json
import sys
from collections import Counter
from pathlib import Path

import torch

from nanosky.metrics import Phases

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # as `python bench/profile_step.py` has it: its `launch` import

from profile_step import breakdown, part_of, self_times  # noqa: E402


def test_the_profiled_steps_train_phase_is_traced_and_split_into_parts(tmp_path, dist_info):
    ph = Phases(str(tmp_path), rank=0, profile_step=2)
    a = torch.randn(256, 256)
    for step in (1, 2):
        with ph(step, "train"):
            for _ in range(20):
                a @ a  # a matmul
            with torch.profiler.record_function("nanosky::head"):
                for _ in range(40):
                    a @ a  # the head's
            a.to(torch.float64)  # a cast
        with ph(step, "generate"):  # never profiled
            a @ a
    traces = sorted(p.name for p in (tmp_path / "profile").iterdir())
    assert traces == ["step2.rank0.train.trace.json", "step2.rank0.train.txt"], traces
    parts, top = breakdown(str(tmp_path / "profile" / traces[0]), ph.times["train"])
    assert parts["head"] > 0 and parts["matmul"] > 0, parts
    # each product in its part, counted (not timed: the other test process shares the 2 cores)
    events = json.load(open(tmp_path / "profile" / traces[0]))["traceEvents"]
    mm = [part_of(e["name"], outer) for e, _, outer in self_times(events) if e["name"] == "aten::mm"]
    assert Counter(mm) == {"head": 40, "matmul": 20}, Counter(mm)
    assert parts["cast/copy"] > 0 and "outside ops" in parts, parts
    assert top[0][0] == "aten::mm", top
    assert abs(sum(parts.values()) - ph.times["train"]) < 1e-6  # the parts cover the phase's wall time
