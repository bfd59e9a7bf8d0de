"""Shared fixtures (the bundled tiny model, a 1-rank process group, the engine) and the suite's three kinds:

    tests/unit/         no vLLM, no torchrun: `make test-fast`, after every edit
    tests/integration/  the real vLLM engine (the `engine` fixture), real sandboxes and SWE grading
    tests/e2e/          run.py or tests/scripts in N ranks over gloo (spawn.torchrun: forked from a server that
                        did the imports once; real torchrun for the launcher's own tests); every test here is slow

`make test` runs all three, unit first, so a broken unit fails the run in seconds.
"""

import os
import sys
from pathlib import Path

import cpu
import pytest
from cpu import FP32

from nanosky import process

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))  # the shared helpers (spawn, helpers_envs) for every test folder
KINDS = ("unit", "integration", "e2e")

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _frozen_heap():
    """Each test starts with the heap frozen, as run.py freezes it after its imports: a collection then scans only
    what the test allocated. Each vLLM engine runs full collections at its start and its shutdown, and with torch,
    transformers and vLLM loaded in this process, scanning the whole heap each time was a large share of the
    integration tests' time. Its shutdown unfreezes the heap first, so what earlier tests left is freed there."""
    process.freeze_heap()


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


BF16_LINES = pytest.StashKey[list[str]]()


def pytest_report_header(config) -> list[str]:
    return cpu.header()


def pytest_report_collectionfinish(config, items) -> list[str]:
    """The bf16 tests' lines under the header (they name collected tests, so they follow the collection)."""
    lines = cpu.bf16_lines(items)
    config.stash[BF16_LINES] = lines
    return lines if config.get_verbosity() >= 0 else []  # shown where the header is


def pytest_terminal_summary(terminalreporter) -> None:
    """The header's CPU lines again at the end (`make test` runs -q, which hides the header)."""
    for line in cpu.header() + terminalreporter.config.stash.get(BF16_LINES, []):
        terminalreporter.write_line(line)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if kind_of(item.path) == "e2e":
            item.add_marker(pytest.mark.slow)
    cpu.skip_full_size(items)
    # a stable sort: unit, then integration, then e2e, each in its collected order
    items.sort(key=lambda item: KINDS.index(kind_of(item.path)))
