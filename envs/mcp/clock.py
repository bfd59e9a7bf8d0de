"""mcp_time: time-zone conversions through the reference server `mcp-server-time` (its `convert_time` tool).

    torchrun --nproc_per_node 2 run.py --env mcp_time --model.path smollm2-135m --engine.max-model-len 1024

"It is 14:30 in Asia/Tokyo. What time is it in Asia/Kolkata then?" The answer (11:00) is computed when the
questions are generated, with `zoneinfo`, from zones whose offset is fixed all year (no daylight saving: the server
converts on today's date, so only such zones give every machine, every day, the same answer). Held out by zone
pair: each ordered pair (source, target) belongs to one split, so a test question converts between two zones never
converted between in training (each zone alone is seen in every split). Rows are in `--env dataset`'s layout
(`question`, `answer` as HH:MM), with the expert's call (`calls`: `convert_time`); generated once per machine from a
fixed seed (`~/.cache/nanosky/mcp_time-v1`, `build`).

The server is stateless, so one runs per env worker, shared by its episodes (started with `--local-timezone UTC`, so
its tool descriptions are the same on every machine). Strict: the `<answer>` tag holds the time; lenient: the last
H:MM / HH:MM the reply states. The best constant answer scores the most frequent answer's share of the split.
"""

from __future__ import annotations

import os
import random
import re
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from envs.answers import extract_answer
from envs.mcp import MCPEnv, publish, split_files, write_rows

SPLITS = ("train", "validation", "test")
# zones with one UTC offset all year (checked at generation: a zone that gains daylight saving fails the build)
ZONES = (
    "UTC", "Africa/Lagos", "Africa/Nairobi", "Africa/Johannesburg", "Asia/Dubai", "Asia/Karachi", "Asia/Kolkata",
    "Asia/Kathmandu", "Asia/Dhaka", "Asia/Bangkok", "Asia/Jakarta", "Asia/Shanghai", "Asia/Singapore",
    "Asia/Manila", "Asia/Tokyo", "Asia/Seoul", "Australia/Brisbane", "Pacific/Honolulu", "America/Phoenix",
    "America/Bogota", "America/Lima", "America/Sao_Paulo", "America/Argentina/Buenos_Aires", "Europe/Moscow",
)  # fmt: skip
PHRASINGS = (
    "It is {time} in {src}. What time is it in {dst} then?",
    "A call is set for {time}, {src} time. What is the local time in {dst} for it?",
    "Convert {time} from {src} to {dst}.",
)
SERVER = "mcp-server-time --local-timezone UTC"
SYSTEM = "Answer with the time as HH:MM (24-hour clock)."
_TIME = re.compile(r"(?<![\d:])([01]?\d|2[0-3]):([0-5]\d)(?![\d:])")


def as_time(text: str | None) -> str | None:
    """The last H:MM / HH:MM in `text`, as HH:MM; None when it states none."""
    found = _TIME.findall(text or "")
    return f"{int(found[-1][0]):02d}:{found[-1][1]}" if found else None


def _fixed_offset(zone: str) -> timedelta:
    tz = ZoneInfo(zone)
    offsets = {datetime(2026, month, 15, 12, tzinfo=tz).utcoffset() for month in range(1, 13)}
    if len(offsets) != 1:
        raise ValueError(f"mcp_time: zone {zone} changes its offset during the year")
    return offsets.pop()


def convert(time: str, src: str, dst: str) -> str:
    h, m = map(int, time.split(":"))
    minutes = (h * 60 + m + (_fixed_offset(dst) - _fixed_offset(src)).total_seconds() // 60) % (24 * 60)
    return f"{int(minutes // 60):02d}:{int(minutes % 60):02d}"


def questions(seed: int = 0, sizes: tuple[int, int, int] = (300, 60, 60)) -> dict[str, list[dict]]:
    """Each split's questions: 70 / 15 / 15 % of the ordered zone pairs, shuffled by `seed`."""
    rng = random.Random(f"mcp_time/{seed}")
    pairs = [(a, b) for a in ZONES for b in ZONES if a != b]
    rng.shuffle(pairs)
    cut = (int(len(pairs) * 0.7), int(len(pairs) * 0.85))
    by_split = dict(zip(SPLITS, (pairs[: cut[0]], pairs[cut[0] : cut[1]], pairs[cut[1] :])))
    out = {}
    for split, n in zip(SPLITS, sizes):
        rows = []
        for src, dst in rng.sample(by_split[split], n):
            time = f"{rng.randrange(24):02d}:{rng.choice(range(0, 60, 5)):02d}"
            rows.append(
                {
                    "question": rng.choice(PHRASINGS).format(time=time, src=src, dst=dst),
                    "answer": convert(time, src, dst),
                    "pair": f"{src}>{dst}",
                    "calls": [
                        {
                            "name": "convert_time",
                            "arguments": {"source_timezone": src, "time": time, "target_timezone": dst},
                        }
                    ],
                }
            )
        out[split] = rows
    return out


def build(folder: str, seed: int = 0) -> str:
    """Write {train,validation,test}.jsonl into `folder` (atomically, so concurrent builders agree)."""

    def fill(tmp: str) -> None:
        for split, rows in questions(seed).items():
            write_rows(os.path.join(tmp, f"{split}.jsonl"), rows)

    return publish(folder, tuple(f"{s}.jsonl" for s in SPLITS), fill)


def time_folder() -> str:
    return build(os.path.join(os.path.expanduser("~/.cache/nanosky"), "mcp_time-v1"))


class TimeEnv(MCPEnv):
    """`--env mcp_time`: the conversions through `mcp-server-time`, one server per env worker."""

    name = "mcp_time"

    def __init__(self, split: str = "train", seed: int = 0, **kwargs):
        folder = time_folder()
        defaults = {
            **split_files(folder),
            "server": SERVER,
            "system_prompt": SYSTEM,
        }
        super().__init__(split, seed, **(defaults | kwargs))

    def is_lenient(self, reply: str) -> bool:
        return as_time(reply) == self.task.answer

    def _score(self, reply: str, lenient: bool) -> tuple[float, bool]:
        if self.reward_spec != "answer":
            return super()._score(reply, lenient)
        pred = (extract_answer(reply) or "").strip()
        ok = _TIME.fullmatch(pred) is not None and as_time(pred) == self.task.answer
        return float(ok), ok

    @classmethod
    def expert_refusal(cls, **kwargs) -> str | None:
        return None
