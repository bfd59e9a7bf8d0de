"""The rollout side's configs: `--rollout.*` (the step's episodes, the agent loop, external agents) and
`--envpool.*` (each rank's env worker processes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class RolloutConfig:
    group_size: int = 8
    """Samples per prompt (the GRPO group n)."""
    prompts_per_step: int = 32
    """Prompts per optimizer step across all ranks (global batch = prompts_per_step × group_size trajectories)."""
    max_new_tokens: int = 64
    """Per assistant turn."""
    max_total_tokens: int = 384
    """Prompt + all turns; the episode stops (stop_reason="max_tokens") when this is reached."""
    max_turns: int | None = None
    """Assistant turns per episode; None = the env's own `max_turns`."""
    temperature: float = 1.0
    top_p: float = 1.0
    max_staleness: int = 0
    """Partial rollouts (docs/partial_rollouts.md): a rank's phase ends when its share of groups is complete, and its
    unfinished episodes go on in the next phase under the new weights, trained at most this many weight versions
    after their first token was sampled. 0 = every episode ends in its own step (the synchronous step)."""
    oversample: float = 1.0
    """Groups in flight per step, as a multiple of prompts_per_step (in [1, 2)): the extra ones fill the engine's
    batch while the phase's last groups finish, and are carried."""
    ignore_eos: bool = False
    """Never stop at the end-of-turn token (set by --dry-run to produce the longest sequences)."""
    mode: Literal["concat", "stepwise"] = "concat"
    """concat: one training row per episode (every turn, observations masked). stepwise: one row per assistant turn,
    sampled from the opening messages and the last `history_window` turns (long episodes in a short context;
    `nanosky/agent/window.py`, `nanosky/train/stepwise.py`). In step-wise mode max_total_tokens bounds each turn's prompt + response."""
    history_window: int = 2
    """stepwise: turns (action + observation) shown before the current one; older turns are dropped."""
    step_weight: Literal["step", "episode"] = "step"
    """stepwise: how rows weigh in the loss. step: every turn the same, so a 30-turn episode weighs 3x a 10-turn one
    (verl-agent's choice). episode: each row's advantage is scaled by S_mean / S_i (S_i its episode's turns, S_mean
    the batch's mean), so every episode carries the same total weight, however long it ran."""

    constrain_actions: bool = False
    """Sample every turn under the env's `action_constraint()`: one of its admissible actions (`action_choices()`:
    webshop_lite, alfworld_lite) or a reply its grammar matches (`action_grammar()`: swe, one well-formed tool call),
    with vLLM's structured outputs, and train under the same masks: the policy is the masked distribution, exactly
    (nanosky/train/constrain.py). Turns of envs that give neither are sampled freely."""

    train_tasks: int | None = None
    """Draw every training prompt from N fixed tasks (env seeds 0..N-1, picked by the step's seeds, with
    replacement): the data-limited regime, e.g. SFT on N demonstrations, then RL on the same N prompts. None: a
    fresh task every prompt. Held-out splits are never limited."""

    max_live_episodes: int | None = None
    """Episodes nanosky's loop keeps in progress at once on each rank; the others wait to start. None: every episode
    of the phase (the engine batches them all). Bound it where each episode holds a process: `--env mcp` with
    `{episode_dir}` starts a server per episode (mcp-server-sqlite: ~40 MB each)."""

    agent: str | None = None
    """Train your own agent: MODULE:FN, an async `solve(client, task) -> float | None` given an OpenAI client
    pointed at this episode's endpoint (nanosky/endpoint/; imported like --plugins). Replaces nanosky's loop."""
    agent_cmd: str | None = None
    """Train an agent in any language: a shell command run once per episode, with OPENAI_BASE_URL, OPENAI_API_KEY
    and NANOSKY_TASK (a JSON file: messages, tools, id, seed) set; reward = a last stdout line {"reward": x}."""
    agent_timeout_s: float = 300.0
    """--rollout.agent / agent-cmd: an episode running longer is masked (it costs that episode only). The time
    counts from the episode's start, not from its wait in the queue (--rollout.agent-concurrency), and with
    --rollout.max-staleness only while its phases run (docs/partial_rollouts.md)."""
    agent_concurrency: int = 32
    """--rollout.agent / agent-cmd: episodes an external agent plays at once on each rank; the others wait in a
    queue. Each may be a process tree of its own (a Python harness is ~100 MB), so this bounds the memory the
    agents take: 32 per rank runs a 200-task eval on a 2-core, 24 GB box."""

    def __post_init__(self):
        if self.agent and self.agent_cmd:
            raise ValueError("give --rollout.agent or --rollout.agent-cmd, not both")
        if self.agent is not None and self.agent.count(":") != 1:
            raise ValueError(f"rollout.agent must be MODULE:FUNCTION (e.g. my_agent:solve), got {self.agent!r}")
        if self.agent_timeout_s <= 0:
            raise ValueError(f"rollout.agent_timeout_s must be > 0, got {self.agent_timeout_s}")
        if self.max_live_episodes is not None and self.max_live_episodes < 1:
            raise ValueError(
                f"rollout.max_live_episodes must be >= 1 (or None: no bound), got {self.max_live_episodes}"
            )
        if self.train_tasks is not None and self.train_tasks < 1:
            raise ValueError(f"rollout.train_tasks must be >= 1 (or None: no limit), got {self.train_tasks}")
        if self.agent_concurrency < 1:
            raise ValueError(f"rollout.agent_concurrency must be >= 1, got {self.agent_concurrency}")
        for f in ("group_size", "prompts_per_step", "max_new_tokens", "max_total_tokens"):
            if getattr(self, f) < 1:
                raise ValueError(f"rollout.{f} must be >= 1, got {getattr(self, f)}")
        if self.mode not in ("concat", "stepwise"):
            raise ValueError(f"rollout.mode must be 'concat' or 'stepwise', got {self.mode!r}")
        if self.step_weight not in ("step", "episode"):
            raise ValueError(f"rollout.step_weight must be 'step' or 'episode', got {self.step_weight!r}")
        if self.history_window < 1:
            raise ValueError(f"rollout.history_window must be >= 1, got {self.history_window}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"rollout.max_turns must be >= 1, got {self.max_turns}")
        if not 0.0 < self.temperature <= 10.0:
            raise ValueError(f"rollout.temperature must be in (0, 10], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.max_staleness < 0:
            raise ValueError(f"rollout.max_staleness must be >= 0, got {self.max_staleness}")
        if not 1.0 <= self.oversample < 2.0:
            # below 2, a step carries fewer groups than it trains: a checkpoint step can finish them all
            raise ValueError(f"rollout.oversample must be in [1, 2), got {self.oversample}")
        if self.oversample > 1.0 and not self.max_staleness:
            raise ValueError(
                "rollout.oversample > 1 carries groups into the next step: it needs rollout.max_staleness >= 1"
            )

    @property
    def partial(self) -> bool:
        """Partial rollouts: episodes may be carried from one step into the next."""
        return self.max_staleness > 0


@dataclass(kw_only=True)
class EnvPoolConfig:
    workers: int = 2
    """Env worker processes per rank (multiprocess, spawn); 0 = step envs in the trainer process."""
    step_timeout_s: float = 60.0
    """A reset/step taking longer costs that trajectory (reward 0, counted in envs/failed); the worker is replaced."""

    def __post_init__(self):
        if self.workers < 0 or self.step_timeout_s <= 0:
            raise ValueError("envpool.workers must be >= 0 and envpool.step_timeout_s > 0")
