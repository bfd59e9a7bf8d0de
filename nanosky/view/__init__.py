"""The rollout viewer: one self-contained HTML page per run (no CDN, nothing from the network; it opens from disk).

    python -m nanosky.view RUN_DIR                 # writes RUN_DIR/view.html and prints its path
    python -m nanosky.view RUN_DIR --out f.html    # elsewhere
    python -m nanosky.view RUN_DIR --serve         # http://127.0.0.1:8765/, re-read whenever the run moves on

The page (page.html, its data embedded as JSON) shows reward and success over steps, each step's groups side by
side, an episode's turns with its tool calls and outputs, its tokens coloured by advantage, log p, trainer-vs-engine
|Δlogp|, importance ratio or entropy (`nanosky.trace` records them), filters, and eval seeds at the first eval vs
the latest. It reads what the run writes (`data.load`): a run dir or an eval's output folder.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from nanosky.view.data import MAX_BYTES, load

PAGE = Path(__file__).with_name("page.html")


def render(path: str, max_bytes: int = MAX_BYTES) -> str:
    """The page for a run dir or an eval folder, as one HTML string."""
    data = load(path, max_bytes)
    try:  # JSON has no NaN (a success rate without a checker, a metric over nothing): the page would not parse
        blob = json.dumps(data, ensure_ascii=False, default=str, allow_nan=False)
    except ValueError:
        blob = json.dumps(finite(data), ensure_ascii=False, default=str)
    # inside <script>, "</" would end the element early, whatever the model wrote: JSON allows "<\/"
    blob = blob.replace("</", "<\\/")
    name = data["name"].replace("&", "&amp;").replace("<", "&lt;")
    return PAGE.read_text(encoding="utf-8").replace("__TITLE__", name).replace("__DATA__", blob)


def finite(x):
    """`x` with every non-finite float as None, at any depth."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite(v) for v in x]
    return x


def write(path: str, out: str | None = None, max_bytes: int = MAX_BYTES) -> Path:
    """Write the page (default RUN_DIR/view.html); returns where."""
    dest = Path(out) if out else Path(path) / "view.html"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(render(path, max_bytes), encoding="utf-8")
    return dest
