"""The one agent loop, in SkyAgent's vocabulary: tasks, backends, a continuous dispatcher and the runner.

    from nanosky.agent import AgentRunner, EnvTask, OpenAIBackend, summarize
    runner = AgentRunner(OpenAIBackend("http://127.0.0.1:8000/v1"), max_parallel_agents=8)
    trajs = runner.run([EnvTask.make("math", "test", seed=i) for i in range(20)])
    print(summarize(trajs))

Training (`nanosky.collect`, through the `Player` interface), the eval during training, `evals/*` and `examples/` all run episodes through
`AgentRunner`; the colocated engine is the `EngineBackend` (token-in/token-out). See examples/serve_and_eval.py for
a standalone evaluation of a served model.
"""

from nanosky.agent.backends import (
    Backend,
    BackendError,
    ContextLengthError,
    EngineBackend,
    GenerationResult,
    OpenAIBackend,
    Request,
)
from nanosky.agent.dispatcher import STAGES, Dispatcher
from nanosky.agent.player import Player, Rollouts
from nanosky.agent.runner import AgentRunner
from nanosky.agent.task import EnvError, EnvTask, PooledEnvTask, Task
from nanosky.agent.trajectory import Trajectory, load_jsonl, save_jsonl, summarize

__all__ = [
    "AgentRunner",
    "Backend",
    "BackendError",
    "ContextLengthError",
    "Dispatcher",
    "EngineBackend",
    "EnvError",
    "EnvTask",
    "GenerationResult",
    "OpenAIBackend",
    "Player",
    "PooledEnvTask",
    "Request",
    "Rollouts",
    "STAGES",
    "Task",
    "Trajectory",
    "load_jsonl",
    "save_jsonl",
    "summarize",
]
