"""Shared fixtures (the bundled tiny model, a 1-rank process group, the engine) and the suite's three kinds:

    tests/unit/         no vLLM, no torchrun: `make test-fast`, after every edit
    tests/integration/  the real vLLM engine (the `engine` fixture), real sandboxes and SWE grading
    tests/e2e/          torchrun over run.py or tests/scripts; every test here is marked slow

`make test` runs all three, unit first, so a broken unit fails the run in seconds.
"""

import gc
import os
import sys
from pathlib import Path

import pytest
from cpu import FP32

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))  # the shared helpers (spawn, helpers_envs) for every test folder
KINDS = ("unit", "integration", "e2e")

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _frozen_heap():
    """Each test starts with the heap frozen (as run.py freezes it after its imports): a collection then scans only
    what the test allocated. Each vLLM engine runs five full collections, three at its start and two at its shutdown,
    ~0.5 s each in this process with torch, transformers and vLLM loaded: with the one test_families added, they were
    40 % of the integration tests' time. Its shutdown unfreezes the heap first, so what earlier tests left is freed
    there."""
    gc.freeze()


@pytest.fixture(scope="session")
def tiny_path() -> str:
    from nanosky.tiny import ensure_tiny_model

    return str(ensure_tiny_model())


@pytest.fixture(scope="session")
def tok(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="session")
def dist_info():
    from nanosky import dist

    return dist.init_distributed()


@pytest.fixture(scope="session")
def engine(tiny_path, dist_info):
    from nanosky.rollout.engine import Engine, EngineConfig

    return Engine(EngineConfig(kv_cache_gib=1, seed=0), tiny_path, dist_info, precision=FP32)


def kind_of(path: Path) -> str:
    rel = Path(path).resolve().relative_to(TESTS).parts
    return rel[0] if len(rel) > 1 and rel[0] in KINDS else "unit"


def pytest_report_header(config) -> list[str]:
    import cpu

    return cpu.header()


def pytest_terminal_summary(terminalreporter) -> None:
    """The header's CPU lines again at the end (`make test` runs -q, which hides the header)."""
    import cpu

    for line in cpu.header():
        terminalreporter.write_line(line)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if kind_of(item.path) == "e2e":
            item.add_marker(pytest.mark.slow)
    # a stable sort: unit, then integration, then e2e, each in its collected order
    items.sort(key=lambda item: KINDS.index(kind_of(item.path)))
