"""bench/plot_runs.py: TensorBoard scalars of several runs drawn as one SVG."""

import importlib.util
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # as `python bench/plot_runs.py` has it: its `launch` import
spec = importlib.util.spec_from_file_location("plot_runs", ROOT / "bench" / "plot_runs.py")
plot_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_runs)
NS = "{http://www.w3.org/2000/svg}"


def _run(path: Path, values: dict[int, float]) -> str:
    w = SummaryWriter(str(path))
    for step, v in values.items():
        w.add_scalar("eval/accuracy", v, step)
    w.close()
    return str(path)


def test_two_runs_become_two_lines_with_their_points_and_labels(tmp_path):
    a = _run(tmp_path / "a", {0: 0.1, 10: 0.2, 20: 0.4})
    b = _run(tmp_path / "b", {0: 0.1, 10: 0.1})
    out = plot_runs.main([f"{a}=grpo", b, "--out", str(tmp_path / "c" / "x.svg"), "--title", "held out"])
    root = ET.parse(out).getroot()
    lines = root.findall(f"{NS}polyline")
    assert [len(p.get("points").split()) for p in lines] == [3, 2]
    texts = [t.text for t in root.iter(f"{NS}text")]
    assert {"grpo", "b", "held out", "step"} <= set(texts)
    # higher values are drawn higher: y pixel of step 20 (0.4) above step 0 (0.1)
    ys = [float(p.split(",")[1]) for p in lines[0].get("points").split()]
    assert ys[2] < ys[1] < ys[0]


def test_smoothing_and_bad_input(tmp_path):
    assert plot_runs.smooth([(1, 0.0), (2, 1.0), (3, 0.5)], 2) == [(1, 0.0), (2, 0.5), (3, 0.75)]
    a = _run(tmp_path / "a", {0: 0.1, 1: 0.2})
    with pytest.raises(SystemExit, match="no scalar 'train/nope'"):
        plot_runs.main([a, "--tag", "train/nope", "--out", str(tmp_path / "x.svg")])
    with pytest.raises(SystemExit, match="smooth"):
        plot_runs.main([a, "--smooth", "0", "--out", str(tmp_path / "x.svg")])
