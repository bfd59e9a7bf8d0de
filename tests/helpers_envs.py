"""Misbehaving envs for the env-pool tests. A module (not a test file) so that spawned pool workers can import it.

"pool_test" echoes each action with a step counter, so a replayed env is distinguishable from a fresh one; the
magic actions make it misbehave: "hang" sleeps 1000 s, "die" kills its process, "raise" raises, "sleep:S" sleeps
S seconds, "unpicklable" returns a result the pipe cannot carry.
"""

import os
import random
import time

import envs
from envs.base import Env, StepResult


@envs.register_env("pool_test")
class PoolTestEnv(Env):
    name = "pool_test"
    max_turns = 5

    def __init__(self, split: str = "train", seed: int = 0, nondeterministic: bool = False):
        self.seed, self.nondeterministic, self.count = seed, nondeterministic, 0

    def reset(self):
        self.count = 0
        return [{"role": "user", "content": f"env {self.seed}"}]

    def step(self, action: str) -> StepResult:
        self.count += 1
        if action == "hang":
            time.sleep(1000)
        elif action == "die":
            os._exit(1)
        elif action == "raise":
            raise RuntimeError("boom")
        elif action.startswith("sleep:"):
            time.sleep(float(action.split(":")[1]))
        elif action == "unpicklable":
            return StepResult([], 0.0, True, {"gen": (x for x in [])})
        text = f"{self.count}:{action}" + (f":{random.random()}" if self.nondeterministic else "")
        return StepResult(
            [{"role": "user", "content": text}],
            float(self.count),
            self.count >= self.max_turns,
            {"pid": os.getpid()},
        )
