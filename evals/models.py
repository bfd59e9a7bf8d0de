"""The model side of an eval: the colocated engine over a checkpoint, or any OpenAI-compatible chat server; the
episodes go through the one agent loop (`nanosky.agent.AgentRunner`), as in training.

    model, tok, name = open_model(cfg)           # --ckpt → (EngineBackend, tokenizer), --base-url → (OpenAIBackend, None)
    trajs = rollout(model, tok, envs, cfg)       # list[nanosky.agent.Trajectory], one per env, with tqdm
    close_model(model)

Engine episodes are token-in/token-out; server episodes carry the server's token usage in `prompt_tokens` /
`completion_tokens`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tqdm import tqdm

from envs.base import Env
from evals import common
from evals.common import BaseEvalConfig
from nanosky.agent import AgentRunner, EngineBackend, EnvTask, OpenAIBackend, Trajectory


def rollout(model, tok, envs: list[Env], cfg: BaseEvalConfig, desc: str = "eval") -> list[Trajectory]:
    """Every env played to the end by `model` (an EngineBackend or an OpenAIBackend); trajectories in env order."""
    engine = isinstance(model, EngineBackend)
    runner = AgentRunner(
        model,
        tok=tok if engine else None,
        max_parallel_agents=cfg.batch_size if engine else cfg.concurrency,
        max_turns=cfg.max_steps,
        max_tokens_per_turn=cfg.max_new_tokens,
        temperature=cfg.temperature,  # 0 = greedy
        max_total_tokens=cfg.max_model_len if engine else None,
        history_window=cfg.history_window,
        constrain_actions=cfg.constrain_actions,
    )
    tasks = [EnvTask(e, task_id=str(i)) for i, e in enumerate(envs)]
    with tqdm(total=len(envs), desc=desc) as bar:
        if cfg.agent:  # the user's agent plays the episodes, through the endpoint
            return external_rollout(model, tok, tasks, cfg, bar)
        runner.on_episode_done = lambda _: bar.update(1)
        return runner.run(tasks, sample_seed=cfg.seed)


def external_rollout(model: EngineBackend, tok, tasks: list[EnvTask], cfg: BaseEvalConfig, bar) -> list[Trajectory]:
    """`--agent MODULE:FN`: every episode played by the user's agent against the endpoint over `model`'s engine,
    sampled with the eval's temperature and budgets."""
    from nanosky.endpoint.harness import Harness
    from nanosky.endpoint.server import Sampling

    sampling = Sampling(cfg.temperature, 1.0, cfg.max_new_tokens, cfg.max_model_len)
    harness = Harness(
        model, tok, sampling, agent=cfg.agent, timeout_s=cfg.agent_timeout_s, concurrency=cfg.agent_concurrency
    )
    harness.on_episode_done = lambda _: bar.update(1)
    try:
        return harness.run(tasks, seeds=list(range(len(tasks))), sample_seed=cfg.seed)
    finally:
        harness.close()


def open_model(cfg: BaseEvalConfig, log_path: str | None = None) -> tuple[Any, Any, str]:
    """(backend, tokenizer or None, name) for --ckpt or --base-url. `log_path`: where the engine's vLLM log lines
    go (the eval's output dir/engine.log); None leaves them on the console."""
    if cfg.base_url:
        backend = OpenAIBackend(cfg.base_url, cfg.model, tool_mode=cfg.api_tool_mode)

        async def name() -> str:
            try:
                return await backend.resolve_model()
            finally:
                await backend.aclose()

        try:
            return backend, None, asyncio.run(name())
        except Exception as e:  # noqa: BLE001 - a dead URL is a usage error, not a traceback
            raise SystemExit(f"--base-url {cfg.base_url}: {e}") from None
    if not cfg.ckpt:
        raise SystemExit("give the model: --ckpt PATH (HF checkpoint dir) or --base-url URL (OpenAI-compatible)")
    from nanosky.bundled import resolve_model_path
    from nanosky.exports import find_export
    from nanosky.gguf import GGUFError

    try:  # a model folder, a checkpoint, or a run dir (its latest); "tiny" etc. = the bundled models; a .gguf file
        folder = resolve_model_path(cfg.ckpt)
        cfg.ckpt = folder if folder != cfg.ckpt else find_export(folder)  # a path as given: it must be a model folder
    except (FileNotFoundError, GGUFError) as e:
        raise SystemExit(f"--ckpt {e}") from None
    from transformers import AutoTokenizer

    from nanosky import dist, precision, process
    from nanosky.rollout.engine import Engine, EngineConfig

    process.freeze_heap()  # the imports' objects leave every collection's scan (vLLM's engine start runs three)
    info = dist.init_distributed()
    prec = precision.decide(cfg.precision, info.device.type)  # the one rule a training run's engine follows
    if warning := precision.emulation_warning(prec, "auto"):
        print(warning, flush=True)
    engine_cfg = EngineConfig(max_model_len=cfg.max_model_len, seed=cfg.seed)
    engine = Engine(engine_cfg, cfg.ckpt, info, log_path=log_path, precision=prec)  # vLLM's lines: to the file
    tok = AutoTokenizer.from_pretrained(cfg.ckpt)
    return EngineBackend(engine, tok), tok, cfg.ckpt


def close_model(model) -> None:
    if isinstance(model, EngineBackend):
        from nanosky import dist

        dist.shutdown()


def run_cli(name: str, cfg: BaseEvalConfig, evaluate_fn) -> dict:
    """Load the model, run `evaluate_fn(model, tok) -> (report, records)`, write the outputs, print the table."""
    if cfg.agent:  # a bad --agent is one line, before any model is loaded
        from nanosky.endpoint.harness import AgentError, load_agent

        try:
            load_agent(cfg.agent)
        except AgentError as e:
            raise SystemExit(f"--agent {e}") from None
    path = common.out_dir(cfg, name)
    model, tok, model_name = open_model(cfg, log_path=str(path / "engine.log"))
    try:
        report, records = evaluate_fn(model, tok)
    finally:
        close_model(model)
    report = {**report, "model": model_name, "data": cfg.data}
    common.write_outputs(path, records, report, cfg)
    print(common.summary_table(report))
    print(
        f"wrote {path / 'examples.jsonl'} and {path / 'report.json'}"
        + (f"; vLLM's log: {path / 'engine.log'}" if cfg.ckpt else "")
    )
    return report
