"""The rollout viewer on real runs: the time to write each page, its size, its render time in headless Chromium,
and a screenshot of each (docs/viewer/<name>.png).

    python bench/viewer_pages.py RUN_DIR [RUN_DIR ...] [--shots docs/viewer]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from browser import driver, open_page  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--shots", default=None, help="a folder for one screenshot per run")
    args = ap.parse_args()
    d = driver()
    d.set_window_size(1280, 1000)
    print(f"{'run':28s} {'rollouts.jsonl':>15s} {'page':>10s} {'write s':>8s} {'render s':>9s}")
    try:
        for run in args.runs:
            out = os.path.join(run, "view.html")
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "nanosky.view", run, "--out", out], check=True, capture_output=True)
            write_s = time.perf_counter() - t0
            render_s = open_page(d, out)
            name = os.path.basename(os.path.normpath(run))
            if args.shots:
                os.makedirs(args.shots, exist_ok=True)
                d.save_screenshot(os.path.join(args.shots, f"{name}.png"))
            src = os.path.join(run, "rollouts.jsonl")
            size = os.path.getsize(src) if os.path.exists(src) else 0
            print(
                f"{name:28s} {size / 1e3:12.0f} kB {os.path.getsize(out) / 1e3:7.0f} kB {write_s:8.2f} {render_s:9.2f}"
            )
    finally:
        d.quit()


if __name__ == "__main__":
    main()
