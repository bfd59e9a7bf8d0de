"""AgentRunner: the one agent loop. Tasks → `Trajectory`s, many episodes at once, continuously, through a
`Dispatcher`. Training, the eval during training, `evals/*` and `examples/` all run episodes through it.

    runner = AgentRunner(EngineBackend(engine, tok, version), tok=tok, max_tokens_per_turn=64, max_total_tokens=384)
    trajs = runner.run([PooledEnvTask(pool, "math", "train", seed=s) for s in seeds], sample_seed=123)

Per episode: initialize the task → render its opening messages once → generate → task.step(decoded turn) → append
the observation turn's ids (loss mask 0) → generate again … until the task says done, or max turns / max total
tokens is reached. With a tokenizer the loop is token-in/token-out: the ids trained on are exactly the ids the
backend sampled, with its per-token logprobs. The first wave's first requests go to the backend together (a
`StartLine`: the engine's first batch is the same whatever order the envs' resets came back in); after that,
episodes advance independently: a sampled turn's env step is submitted at once, and when it returns, the episode's
next request joins the backend's queue at once (no wave barrier). With `sample_seed`, request k of episode i gets
the seed derive_seed(sample_seed, i, turn), so the same call in the same batch samples the same tokens: a
single-turn phase is exactly reproducible (exact resume); later turns' batches form as env steps come back. With
`history_window=K` (step-wise mode) each turn is sampled from its own prompt instead: the opening messages and the
last K turns, re-rendered (`nanosky.agent.window`); the sampled ids and that prompt are kept per turn in
`Trajectory.steps`.
With `constrain_actions` each turn is sampled under the task's `action_constraint()`: one of the env's admissible
actions, or a reply matching its grammar (one well-formed tool call; `nanosky.train.constrain`), and the constraint is
kept with the turn so the trainer scores it under the same masks.

A task that hangs, crashes or raises, or a backend error, costs that episode only (stop_reason env_error /
timeout / error / backend_error). Any other exception from the backend (stale weights, a bug) stops the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from nanosky.agent.backends import Backend, BackendError, ContextLengthError, Request
from nanosky.agent.dispatcher import STAGES, Dispatcher, StartLine
from nanosky.agent.player import Episode, Layout, Rollouts
from nanosky.agent.task import EnvError, Task
from nanosky.agent.trajectory import SCORED, Step, Trajectory, success_of
from nanosky.agent.window import window
from nanosky.config import RolloutConfig
from nanosky.rollout.chat import encode, observation_ids, prompt_ids
from nanosky.seeds import derive_seed


class _Fatal(Exception):
    """Carries an exception that must stop the run (not just its episode) past the per-episode handler."""


class AgentRunner:
    """`max_parallel_agents` bounds every stage (None = no bound: every episode is live at once, the engine batches
    them); `stage_limits` overrides single stages; `max_live_episodes` bounds the episodes in progress at once (the
    others wait to start; None: no bound). `max_turns` None = each task's own. `max_total_tokens` stops an
    episode whose prompt + turns reach it. `task_timeout_s` bounds one episode's whole turn loop. `tok`: the
    tokenizer for token-in/token-out bookkeeping (needed by token-in backends; optional for HTTP ones)."""

    def __init__(
        self,
        backend: Backend,
        tok=None,
        *,
        max_parallel_agents: int | None = 8,
        max_turns: int | None = None,
        max_tokens_per_turn: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_total_tokens: int | None = None,
        task_timeout_s: float | None = None,
        stage_limits: dict[str, int] | None = None,
        ignore_eos: bool = False,
        history_window: int | None = None,
        constrain_actions: bool = False,
        max_live_episodes: int | None = None,
    ):
        if max_tokens_per_turn < 1 or (max_turns is not None and max_turns < 1):
            raise ValueError("max_tokens_per_turn and max_turns must be >= 1")
        if history_window is not None and history_window < 1:
            raise ValueError("history_window must be >= 1 (or None: the whole conversation)")
        if max_parallel_agents is not None and max_parallel_agents < 1:
            raise ValueError("max_parallel_agents must be >= 1 (or None: no bound)")
        self.backend, self.tok, self.max_turns = backend, tok, max_turns
        self.max_tokens_per_turn, self.temperature, self.top_p = max_tokens_per_turn, temperature, top_p
        self.max_total_tokens, self.task_timeout_s, self.ignore_eos = (
            max_total_tokens,
            task_timeout_s,
            ignore_eos,
        )
        self.max_parallel_agents, self.stage_limits = max_parallel_agents, dict(stage_limits or {})
        self.history_window, self.constrain_actions = history_window, constrain_actions
        self.max_live_episodes = max_live_episodes
        self.last_dispatcher: Dispatcher | None = None  # inspect .peak after a run
        self.on_episode_done: Callable[[Trajectory], None] | None = None  # e.g. a progress bar's update
        self._carried: Dispatcher | None = None  # `start`'s episodes

    @classmethod
    def from_config(cls, cfg: RolloutConfig, backend: Backend, tok) -> AgentRunner:
        """The training run's loop, as `--rollout.*` says: every episode live at once (the engine batches them; at most
        `--rollout.max-live-episodes` where set),
        turns sampled from a history window in step-wise mode."""
        return cls(
            backend,
            tok=tok,
            max_parallel_agents=None,
            max_turns=cfg.max_turns,
            max_tokens_per_turn=cfg.max_new_tokens,
            max_total_tokens=cfg.max_total_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            ignore_eos=cfg.ignore_eos,
            constrain_actions=cfg.constrain_actions,
            history_window=cfg.history_window if cfg.mode == "stepwise" else None,
            max_live_episodes=cfg.max_live_episodes,
        )

    def run(
        self,
        tasks: list[Task],
        groups: list[int] | None = None,
        seeds: list[int] | None = None,
        sample_seed: int | None = None,
    ) -> list[Trajectory]:
        """Blocking: runs its own event loop (use `arun` from async code). `groups` / `seeds` are recorded on the
        trajectories (prompt group, env seed); `sample_seed` fixes every request's sampling seed."""

        async def main():
            # Env steps that block (in-process envs, pool set-up) run in threads; size the executor to the stages.
            n = self._limits(len(tasks))
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max(n["step"], n["initialize"]) + 4))
            try:
                return await self.arun(tasks, groups, seeds, sample_seed)
            finally:
                await self.backend.aclose()

        return asyncio.run(main())

    async def play(self, tasks: list[Task], *, groups=None, seeds=None, sample_seed=None, temperature=None) -> Rollouts:
        """The `Player` interface: every task's episode, with the rows they make (`layout`)."""
        trajs, wall_s = await self._play(tasks, Episode.of_phase(len(tasks), groups, seeds, sample_seed), temperature)
        return Rollouts(trajs, self.layout(trajs), wall_s)

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        return {}  # the step's scalars (nanosky/metrics.py) already cover the built-in loop

    def layout(self, trajs: list[Trajectory]) -> Layout:
        """A row per turn when turns are sampled from a history window (step-wise), else a row per episode."""
        return "stepwise" if self.history_window else "concat"

    async def aclose(self) -> None:
        await self.backend.aclose()

    async def arun(self, tasks, groups=None, seeds=None, sample_seed=None, temperature=None) -> list[Trajectory]:
        """`temperature` overrides the runner's for this call (the eval's)."""
        return (await self._play(tasks, Episode.of_phase(len(tasks), groups, seeds, sample_seed), temperature))[0]

    async def _play(
        self, tasks: list[Task], episodes: list[Episode], temperature: float | None
    ) -> tuple[list[Trajectory], float]:
        """Every task's episode through one dispatcher; returns the trajectories and the wall time they took."""
        d = self.last_dispatcher = Dispatcher(self._limits(len(tasks)))
        temp = self.temperature if temperature is None else temperature
        # the wave: the episodes that start at once (within the live bound and the stages they pass to get there)
        wave = min(len(tasks), self.max_live_episodes or len(tasks), d.limits["initialize"], d.limits["generate"])
        line = StartLine(range(wave))
        t0 = time.perf_counter()
        try:
            trajs = await d.map(
                lambda i, task: self._episode(d, task, episodes[i], temp, line=line), tasks, self.max_live_episodes
            )
        except _Fatal as e:
            raise e.__cause__ from None
        return trajs, time.perf_counter() - t0

    def start_episode(self, task: Task, episode: Episode, *, via: Backend | None = None) -> asyncio.Task:
        """One episode as a task on the running loop, not bound to a phase (a partial rollout carries it from one
        phase into the next: `nanosky/partial.py`). Its request k samples with derive_seed(sample_seed, index, k),
        through `via` (default: the runner's backend). Awaiting it gives the trajectory; an error that must stop the
        run is raised from it."""
        if self._carried is None:  # one dispatcher for every carried episode: no bound, as in training
            self._carried = Dispatcher({s: 1 << 30 for s in STAGES} | self.stage_limits)

        async def run() -> Trajectory:
            try:
                return await self._episode(self._carried, task, episode, self.temperature, via)
            except _Fatal as e:
                raise e.__cause__ from None

        return asyncio.ensure_future(run())

    def settle(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """Carried episodes as they are: a fatal error was raised from the episode itself (`start`)."""
        return trajs

    def _limits(self, n_tasks: int) -> dict[str, int]:
        bound = self.max_parallel_agents or max(n_tasks, 1)
        return {s: bound for s in STAGES} | self.stage_limits

    async def _episode(self, d: Dispatcher, task: Task, ep: Episode, temp: float, via=None, line=None) -> Trajectory:
        """One episode to its end; `line`: the phase's `StartLine` (its entrants are episode indices) or None."""
        t0 = time.perf_counter()
        t = ep.trajectory(task)
        try:
            async with d.stage("initialize"):
                await task.initialize_runtime()
            t.messages = list(task.get_instruction())
            if not t.messages:
                raise EnvError("the task gave no opening messages")
            if self.tok is not None:
                t.ids = prompt_ids(self.tok, t.messages, task.tools or None)
                t.loss_mask, t.logprobs, t.prompt_len = [0] * len(t.ids), [0.0] * len(t.ids), len(t.ids)
            loop = self._turns(d, task, t, ep, temp, via or self.backend, line)
            t.stop_reason = await (asyncio.wait_for(loop, self.task_timeout_s) if self.task_timeout_s else loop)
        except _Fatal:
            raise
        except Exception as e:  # noqa: BLE001 - costs this episode only
            t.stop_reason, t.error = _stop_reason(e), f"{type(e).__name__}: {e}"[:1000]
        finally:
            if line is not None:  # ended before its first request (or after): the wave goes on without it
                line.leave(ep.index)
        try:
            await task.complete_runtime()
        except Exception as e:  # noqa: BLE001
            t.error = (t.error + " | " if t.error else "") + f"complete_runtime: {e!r}"[:500]
        if t.stop_reason in SCORED:
            try:
                async with d.stage("evaluate"):
                    verdict = await task.evaluate_result(t)
                t.reward, t.success = float(verdict.get("reward", 0.0)), success_of(verdict)
            except Exception as e:  # noqa: BLE001
                t.stop_reason, t.error = "error", f"evaluate_result: {e!r}"[:1000]
        if t.stop_reason == "prompt_too_long":  # skipped: no token sampled, nothing to grade (counted by the step)
            t.reward, t.success = 0.0, None
        elif t.stop_reason not in SCORED:
            t.reward, t.success = 0.0, False  # a failed episode scores 0 and says why in `error`
        t.latency_s = round(time.perf_counter() - t0, 4)
        if self.on_episode_done is not None:
            self.on_episode_done(t)
        return t

    async def _turns(
        self, d: Dispatcher, task: Task, t: Trajectory, ep: Episode, temp: float, backend: Backend, line=None
    ) -> str:
        """Generate / step until the task is done or a limit is hit; returns the stop reason. A turn: its prompt and
        token budget, one sample under the task's constraint, one env step, the stop rules, the observation's ids."""
        tools, max_turns = task.tools or None, self.max_turns or task.max_turns
        state = task.state_key()  # before the first action
        if state is None:
            state = observation_key(t.messages[-1:])
        for turn in range(1, max_turns + 1):
            shown, ids = self._prompt(t, tools)
            budget = self._budget(ids)
            if budget < 1:  # an opening that leaves no room to answer is skipped, not scored
                return "prompt_too_long" if turn == 1 else "max_tokens"
            rule = await task.action_constraint() if self.constrain_actions else None
            seed = None if ep.sample_seed is None else derive_seed(ep.sample_seed, ep.index, turn - 1)
            req = self._request(shown, ids, tools=tools, budget=budget, temp=temp, seed=seed, rule=rule)
            if line is not None and turn == 1:
                await line.reach(ep.index)
            g = await self._generate(d, backend, req, t)
            ended_at_eos = self._append_turn(t, g, ids if self.history_window else None, rule or None)
            res = await self._step(d, task, t, g.text, turn)
            t.state_keys.append(state)
            state = res.info.get("state_key")
            if state is None:  # an env without state keys: the observation text names the state
                state = observation_key(res.observations)
            if stop := self._stop(res, g, turn, max_turns, ended_at_eos) or self._observe(t, res, tools):
                return stop
            t.messages += res.observations
        return "max_turns"

    def _prompt(self, t: Trajectory, tools) -> tuple[list[dict], list[int] | None]:
        """This turn's messages and prompt ids: the conversation (its ids as they grew), or step-wise the opening and
        the last K turns, re-rendered (`window`). Ids are None without a tokenizer (an HTTP backend renders)."""
        if not self.history_window:
            return list(t.messages), t.ids if self.tok is not None else None
        shown = window(t.messages, self.history_window)
        return shown, prompt_ids(self.tok, shown, tools) if self.tok is not None else None

    def _budget(self, ids: list[int] | None) -> int:
        """The turn's new-token budget: the per-turn cap, within what `max_total_tokens` leaves after the prompt."""
        if ids is None or not self.max_total_tokens:
            return self.max_tokens_per_turn
        return min(self.max_tokens_per_turn, self.max_total_tokens - len(ids))

    def _request(self, shown, ids, *, tools, budget: int, temp: float, seed, rule) -> Request:
        """The turn's request; `rule`: the constraint, a list of choices or a grammar string."""
        choices, grammar = (None, rule) if isinstance(rule, str) else (rule, None)
        return Request(
            messages=shown,
            tools=tools,
            max_tokens=budget,
            temperature=temp,
            prompt_ids=ids,
            top_p=self.top_p,
            seed=seed,
            ignore_eos=self.ignore_eos,
            choices=choices,
            grammar=grammar,
        )

    async def _generate(self, d: Dispatcher, backend: Backend, req: Request, t: Trajectory):
        """One sample, logged in `t.turn_log`. A backend's or the env's error (a demonstration's expert) costs the
        episode; any other (stale weights, a bug in the backend) stops the run."""
        async with d.stage("generate"):
            t1 = time.perf_counter()
            try:
                g = await backend.generate(req)
            except (BackendError, EnvError):
                raise
            except Exception as e:
                raise _Fatal() from e
            gen_s = time.perf_counter() - t1
        t.turn_log.append(
            {
                "finish_reason": g.finish_reason,
                "prompt_tokens": g.prompt_tokens,
                "completion_tokens": g.completion_tokens,
                "latency_s": round(gen_s, 4),
            }
        )
        return g

    async def _step(self, d: Dispatcher, task: Task, t: Trajectory, text: str, turn: int):
        """The env's step on the decoded turn: its reward, info and tool-call counts recorded on `t`."""
        async with d.stage("step"):
            t1 = time.perf_counter()
            res = await task.step(text)
            t.turn_log[-1] |= {"step_latency_s": round(time.perf_counter() - t1, 4), "reward": float(res.reward)}
        t.turn_rewards.append(float(res.reward))
        t.info.update({k: v for k, v in res.info.items() if k != "calls"})
        t.info.setdefault("calls", []).extend({**c, "turn": turn} for c in res.info.get("calls", []))
        t.tool_calls = int(res.info.get("tool_calls", len(t.info["calls"])))
        t.invalid_tool_calls = int(res.info.get("invalid_calls", sum(not c.get("ok", True) for c in t.info["calls"])))
        return res

    def _stop(self, res, g, turn: int, max_turns: int, ended_at_eos: bool) -> str | None:
        """The stop rules after a step, in order: the task is done; the turns are used up; the turn was cut off (what
        follows would answer half a turn); without a tokenizer, the backend's count reached `max_total_tokens`."""
        if res.done:
            return "done"
        if turn >= max_turns:
            return "max_turns"
        if g.finish_reason == "length" and not ended_at_eos:
            return "max_tokens"
        if (
            self.tok is None
            and self.max_total_tokens
            and g.prompt_tokens + g.completion_tokens >= self.max_total_tokens
        ):
            return "max_tokens"
        return None

    def _observe(self, t: Trajectory, res, tools) -> str | None:
        """Append the observation turn's ids (loss mask 0), or stop when they would reach `max_total_tokens` (step-wise:
        each turn's own prompt is checked against it before it is sampled)."""
        if self.tok is None:
            return None
        obs = observation_ids(self.tok, t.messages, res.observations, tools)
        if not self.history_window and self.max_total_tokens and len(t.ids) + len(obs) >= self.max_total_tokens:
            return "max_tokens"
        t.ids += obs
        t.loss_mask += [0] * len(obs)
        t.logprobs += [0.0] * len(obs)
        return None

    def _append_turn(
        self, t: Trajectory, g, prompt: list[int] | None = None, rule: list[str] | str | None = None
    ) -> bool:
        """Record one assistant turn (and, step-wise, the `prompt` it was sampled from as a `Step`; `rule`, the
        choices or grammar it was constrained to); returns whether it ended with the end-of-turn token."""
        t.turns += 1
        t.messages.append({"role": "assistant", "content": g.text})
        t.prompt_tokens += g.prompt_tokens
        t.completion_tokens += g.completion_tokens
        if self.tok is None:
            return g.finish_reason == "stop"
        eos = self.tok.eos_token_id
        ids = g.token_ids
        if ids is None:  # the documented fallback: a server that does not return ids → re-tokenise its text
            ids = encode(self.tok, g.text) + ([eos] if g.finish_reason == "stop" else [])
        lps = g.logprobs if g.logprobs is not None and len(g.logprobs) == len(ids) else [0.0] * len(ids)
        if rule is not None and not isinstance(
            rule, str
        ):  # a reply no sampler drew from the choices (a demonstration's move off
            # the list: webshop_lite's title search) trains without their mask, which would refuse its tokens
            rule = list(rule) if g.token_ids is not None or g.text in rule else None
        if rule and ids:
            t.constraints.append((len(t.ids), rule))
        versions = list(g.versions) if g.versions is not None and len(g.versions) == len(ids) else None
        if versions is not None:  # which weights sampled each id
            t.versions += [-1] * (len(t.ids) - len(t.versions)) + versions
        t.ids += ids
        t.loss_mask += [1] * len(ids)
        t.logprobs += lps
        if prompt is not None:
            t.steps.append(Step(prompt, list(ids), list(lps), rule or None, versions=versions))
        return ids[-1:] == [eos]


def _stop_reason(e: BaseException) -> str:
    if isinstance(e, ContextLengthError):
        return "max_tokens"
    if isinstance(e, BackendError):
        return "backend_error"
    if isinstance(e, EnvError):
        return "env_error"
    if isinstance(e, asyncio.TimeoutError | TimeoutError):
        return "timeout"
    return "error"


def observation_key(messages: list[dict]) -> str:
    """The state key of an env that defines none: the observation text (also the endpoint's, for an external
    agent's calls: `nanosky/endpoint/server.py`)."""
    return "\n".join(str(m.get("content", "")) for m in messages)
