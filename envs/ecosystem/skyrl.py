"""skyrl_gym: SkyRL-Gym's environments on rows in SkyRL's dataset layout, episodes as SkyRL plays them.

    torchrun --nproc_per_node 2 run.py --env skyrl_gym --env-data gsm8k_multi_turn.parquet
    torchrun --nproc_per_node 2 run.py --env skyrl_gym --env-data rows.jsonl --env-kwargs.env-class gsm8k

A row: `prompt` (a chat list), `env_class` ("gsm8k", "gsm8k_multi_turn", "aime", "lcb", or one the user registers
with `skyrl_gym.register` in a `--plugins` module), `reward_spec` / `reward_model`, `extra_info`, `data_source`.
Each episode is `skyrl_gym.make(row["env_class"], env_config=..., extras=row)`, then `init(prompt)`, then
`step(text)` until `done`: the env's observations are appended as it returns them, its rewards summed, its
`metadata` put in the step's info, and its `get_metrics()` aggregated by the class's own `aggregate_metrics` into
TensorBoard as `env/<env_class>/<name>`. `--env-kwargs.env-config '{"gsm8k": {...}}'` is each class's env_config
(an OmegaConf node, as SkyRL passes it); `--env-kwargs.env-class NAME` overrides the rows' class. Success is a
final reward of 1 or more (SkyRL-Gym's envs give 1.0 for a correct answer).

Isolation: an env that runs the model's code (`lcb`, or any single-turn class named in `--env-kwargs.sandboxed`)
takes each step in a fresh process under nanosky's sandbox (envs/tools/sandbox.py, the limits of `python_exec`):
no network namespace, a read-only host, CPU time, address space, processes and file size capped, the whole tree
killed at the time limit. It does not cover what the host kernel shares (CPU caches, /proc of the host where
namespaces are off); where unprivileged namespaces are unavailable only the rlimits and the timeout apply.
The splits are those of `--env dataset` (`--env-kwargs.test-data`, else a held-out fraction by prompt hash).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys

from envs.base import Env, Message, StepResult
from envs.ecosystem import require, skyrl_step
from envs.ecosystem.rows import DataError, Task, chat, split_tasks

SANDBOXED = ("lcb",)  # SkyRL-Gym's classes that execute the model's code
STEP_TIMEOUT_S, STEP_MEM_MB = 60.0, 2048


def _classes() -> list[str]:
    return sorted(require("skyrl_gym").registry)


def _task(row: dict) -> Task:
    if "prompt" not in row:
        raise DataError(f"no column 'prompt'; columns found: {', '.join(row)}")
    return Task(chat(row["prompt"], "prompt"), None, str(row.get("data_source") or "skyrl"), dict(row))


@functools.lru_cache(maxsize=16)
def load_split(data_path: str, split: str, test_data: str | None, test_fraction: float) -> tuple[Task, ...]:
    """The split's rows (cached per process), as `--env dataset` splits them."""
    return split_tasks(data_path, split, test_data, test_fraction, _task)


def _config(env_config, cls: str):
    if isinstance(env_config, str):
        env_config = json.loads(env_config) if env_config.strip() else {}
    node = (env_config or {}).get(cls, {})
    return require("omegaconf").OmegaConf.create(node)


STEP_PROGRAM = os.path.abspath(skyrl_step.__file__)
"""A sandboxed step's program (`skyrl_step.py`), run by path: it imports SkyRL-Gym, not nanosky's `envs`."""


class SkyRLGymEnv(Env):
    """One SkyRL-Gym episode: the row's env class made with the row as `extras`, played to its `done`."""

    name = "skyrl_gym"
    max_turns = 1

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        data_path: str | None = None,
        env_class: str | None = None,
        env_config=None,
        test_data: str | None = None,
        test_fraction: float = 0.1,
        sandboxed: str | list | None = None,
    ):
        if data_path is None:
            raise DataError("env skyrl_gym needs rows: --env-data FILE (SkyRL's layout: prompt, env_class, ...)")
        sg = require("skyrl_gym")
        import skyrl_gym.envs  # noqa: F401 - registers SkyRL-Gym's own classes

        rows = load_split(str(data_path), split, test_data and str(test_data), float(test_fraction))
        self.task, self.n_rows = rows[seed % len(rows)], len(rows)
        self.row = self.task.columns
        self.cls = env_class or self.row.get("env_class")
        if not self.cls:
            raise DataError(
                f"{data_path}: the row has no 'env_class' (pass --env-kwargs.env-class NAME); "
                f"columns found: {', '.join(self.row)}"
            )
        if self.cls not in sg.registry:
            raise DataError(
                f"skyrl_gym: unknown env class {self.cls!r}; registered: {', '.join(_classes())} "
                "(register yours with skyrl_gym.register in a --plugins module)"
            )
        self.config = _config(env_config, self.cls)
        self.extras = self.row | ({"env_class": self.cls} if env_class else {})
        try:
            self.env = sg.make(self.cls, env_config=self.config, extras=self.extras)
        except Exception as e:  # noqa: BLE001 - SkyRL's envs assert on missing fields: one line naming it
            raise DataError(f"skyrl_gym {self.cls!r}: the row does not fit ({type(e).__name__}: {e})") from None
        self.max_turns = int(getattr(self.env, "max_turns", 1) or 1)
        names = sandboxed.split(",") if isinstance(sandboxed, str) else list(sandboxed or ())
        self.sandboxed = self.cls in SANDBOXED or self.cls in names
        self.split, self.seed, self.total = split, seed, 0.0

    def reset(self) -> list[Message]:
        messages, _meta = self.env.init([dict(m) for m in self.task.prompt])
        self.total = 0.0
        return [dict(m) for m in messages]

    def _sandboxed_step(self, action: str) -> dict:
        from envs.tools.sandbox import run_sandboxed

        payload = json.dumps(
            {
                "cls": self.cls,
                "config": require("omegaconf").OmegaConf.to_container(self.config),
                "row": self.extras,
                "action": action,
            },
            default=repr,
        )
        res = run_sandboxed(
            [sys.executable, STEP_PROGRAM],
            extra_ro_paths=[os.path.dirname(STEP_PROGRAM)],  # visible in the sandbox when the checkout is under /tmp
            stdin=payload,
            timeout_s=STEP_TIMEOUT_S,
            mem_mb=STEP_MEM_MB,
            max_procs=64,
            max_output_bytes=4_000_000,
        )
        _, mark, tail = res.stdout.rpartition(skyrl_step.MARK)
        if not mark:
            why = res.killed_reason or f"exit {res.returncode}: {res.stderr.strip()[-300:]}"
            return {"observations": [], "reward": 0.0, "done": True, "metadata": {"sandbox_error": why}}
        return json.loads(tail)

    def step(self, action: str) -> StepResult:
        action = action if isinstance(action, str) else ""
        try:
            out = self._sandboxed_step(action) if self.sandboxed else self.env.step(action)
        except Exception as e:  # noqa: BLE001 - an env that trips on a reply: the episode ends, scored 0
            out = {
                "observations": [],
                "reward": 0.0,
                "done": True,
                "metadata": {"error": f"{type(e).__name__}: {e}"},
            }
        reward = float(out.get("reward") or 0.0)
        self.total += reward
        done = bool(out.get("done"))
        info = {
            "metadata": out.get("metadata") or {},
            "env_class": self.cls,
            "success": done and reward >= 1.0,
        }
        if done or not self.sandboxed:
            metrics = self.env.get_metrics() if not self.sandboxed else {}
            info["env_metrics"] = {f"{self.cls}/{k}": v for k, v in (metrics or {}).items()}
        obs = [dict(m) for m in out.get("observations") or []]
        return StepResult([] if done else obs, reward, done, info)

    def close(self) -> None:
        try:
            self.env.close()
        except Exception:  # noqa: BLE001
            pass

    @staticmethod
    def aggregate_metrics(metrics: list[dict]) -> dict[str, float]:
        """Each env class's episodes through the class's own `aggregate_metrics`, as `<env_class>/<name>`."""
        sg = require("skyrl_gym")
        by_cls: dict[str, list[dict]] = {}
        for m in metrics:  # an episode's metrics all carry its class: "<env_class>/<name>"
            if m:
                cls = next(iter(m)).partition("/")[0]
                by_cls.setdefault(cls, []).append({k.partition("/")[2]: v for k, v in m.items()})
        out = {}
        for cls, ms in by_cls.items():
            entry = sg.registry[cls].entry_point if cls in sg.registry else None
            if isinstance(entry, str):
                module, _, attr = entry.partition(":")
                entry = getattr(importlib.import_module(module), attr)
            agg = entry.aggregate_metrics(ms) if entry is not None else {}
            out |= {f"{cls}/{k}": float(v) for k, v in agg.items() if isinstance(v, (int, float))}
        return out
