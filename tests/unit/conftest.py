"""Unit tests run without vLLM and without torchrun (`make test-fast`). A test that loads vLLM fails here, naming the
folder it belongs in."""

import sys

import pytest


@pytest.fixture(autouse=True)
def _no_vllm():
    before = "vllm" in sys.modules
    yield
    if not before and "vllm" in sys.modules:
        pytest.fail("this test loaded vLLM: it belongs in tests/integration/ (the engine) or tests/e2e/ (torchrun)")
