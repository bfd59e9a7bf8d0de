"""SkyAgent-style agent layer: tasks, backends, a pipelined dispatcher and the runner that ties them together.

    from nanosky.agent import AgentRunner, EnvTask, OpenAIBackend, summarize
    runner = AgentRunner(OpenAIBackend("http://127.0.0.1:8000/v1"), max_parallel_agents=8)
    trajs = runner.run([EnvTask.make("math", "test", seed=i) for i in range(20)])
    print(summarize(trajs))

See examples/serve_and_eval.py for a standalone evaluation of a served model.
"""

from nanosky.agent.backends import (
    Backend,
    BackendError,
    ContextLengthError,
    EngineBackend,
    GenerationResult,
    OpenAIBackend,
)
from nanosky.agent.dispatcher import STAGES, Dispatcher
from nanosky.agent.runner import AgentRunner, AgentTrajectory, load_jsonl, save_jsonl, summarize
from nanosky.agent.task import EnvError, EnvTask, PooledEnvTask, Task

__all__ = [
    "AgentRunner",
    "AgentTrajectory",
    "Backend",
    "BackendError",
    "ContextLengthError",
    "Dispatcher",
    "EngineBackend",
    "EnvError",
    "EnvTask",
    "GenerationResult",
    "OpenAIBackend",
    "PooledEnvTask",
    "STAGES",
    "Task",
    "load_jsonl",
    "save_jsonl",
    "summarize",
]
