"""`--precision`: one decision (nanosky/precision.py) that the engine's dtype, FSDP2's mixed precision, QLoRA's
compute dtype and the build checks' tolerance all read."""

import pytest
import torch

from nanosky import precision
from nanosky.config import EngineConfig
from nanosky.dist import DistInfo
from nanosky.rollout.engine import engine_args

AMX = frozenset({"avx512f", "amx_bf16", "amx_tile", "avx512_bf16"})
NO_AMX = frozenset({"avx2", "avx512f"})


def test_auto_is_bf16_on_cuda_and_on_a_cpu_with_bf16_units_fp32_elsewhere():
    assert precision.decide("auto", "cuda", NO_AMX).name == "bf16"
    amx = precision.decide("auto", "cpu", AMX)
    assert amx.name == "bf16" and "amx_bf16" in amx.why
    zen4 = precision.decide("auto", "cpu", frozenset({"avx2", "avx512f", "avx512_bf16"}))  # bf16 units without AMX
    assert zen4.name == "bf16" and "avx512_bf16" in zen4.why
    plain = precision.decide("auto", "cpu", NO_AMX)
    assert plain.name == "fp32" and "no bf16 units" in plain.why


def test_an_asked_precision_is_kept_and_a_bad_one_refused():
    assert precision.decide("bf16", "cpu", NO_AMX).name == "bf16"  # emulated, slower, but asked for
    assert precision.decide("fp32", "cuda").name == "fp32"
    with pytest.raises(ValueError, match="--precision"):
        precision.decide("fp16", "cpu")
    with pytest.raises(ValueError):
        precision.Precision("half", "cpu")


def test_what_bf16_changes():
    bf16, fp32 = precision.Precision("bf16", "cpu"), precision.Precision("fp32", "cpu")
    assert (bf16.engine_dtype, fp32.engine_dtype) == ("bfloat16", "float32")
    assert (bf16.compute_dtype, fp32.compute_dtype) == (torch.bfloat16, torch.float32)
    mp = bf16.mixed_policy()
    assert (mp.param_dtype, mp.reduce_dtype) == (torch.bfloat16, torch.float32)  # fp32 gradients for fp32 masters
    assert fp32.mixed_policy() is None
    assert fp32.build_tol == 1e-4 and bf16.build_tol == 0.1


def _info(device: str) -> DistInfo:
    return DistInfo(rank=0, world=1, local_rank=0, device=torch.device(device), backend="gloo")


def test_the_engine_dtype_follows_the_run_unless_set():
    """One rule (`precision.engine_dtype`), in the engine and in the start-up checks; no precision, no engine: there
    is no second, silent rule for components built outside a run."""
    bf16, fp32 = precision.Precision("bf16", "cpu"), precision.Precision("fp32", "cpu")
    assert engine_args(EngineConfig(), _info("cpu"), "m", precision=bf16)["dtype"] == "bfloat16"
    assert engine_args(EngineConfig(), _info("cpu"), "m", precision=fp32)["dtype"] == "float32"
    assert engine_args(EngineConfig(dtype="float32"), _info("cpu"), "m", precision=bf16)["dtype"] == "float32"
    assert precision.engine_dtype("auto", bf16) == "bfloat16" and precision.engine_dtype("float16", bf16) == "float16"
    with pytest.raises(TypeError, match="precision"):
        engine_args(EngineConfig(), _info("cpu"), "m")
    assert not hasattr(precision, "of_device")


def test_bf16_shards_keep_fp32_masters_and_compute_in_bf16(tiny_path, dist_info):
    from nanosky.train.policy import load_model

    ids = torch.randint(3, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    bf16 = load_model(tiny_path, dist_info, precision=precision.Precision("bf16", "cpu"))
    fp32 = load_model(tiny_path, dist_info, precision=precision.Precision("fp32", "cpu"))
    assert all(p.dtype == torch.float32 for p in bf16.parameters())  # the masters, as the optimizer steps them
    with torch.no_grad():
        lo, hi = bf16(input_ids=ids).logits, fp32(input_ids=ids).logits
    assert (lo.dtype, hi.dtype) == (torch.bfloat16, torch.float32)
    gap = float((lo.float() - hi).abs().max())
    assert 0 < gap < 0.5, gap  # the same model, rounded


def test_bf16_on_a_cpu_without_bf16_units_warns_once_with_the_measured_factor():
    """`--precision bf16` (or `--engine.dtype bfloat16`) where bf16 is emulated starts with one warning line that
    names the flag, the slowdown and the way out; a CPU with AMX or AVX-512-BF16, fp32, and CUDA say nothing."""
    bf16, fp32 = precision.decide("bf16", "cpu"), precision.decide("fp32", "cpu")
    w = precision.emulation_warning(bf16, "auto", NO_AMX, slowdown=lambda: 97.4)
    assert w is not None and "--precision bf16" in w and "97x slower" in w and "--precision auto" in w
    w = precision.emulation_warning(fp32, "bfloat16", NO_AMX, slowdown=lambda: 3.0)
    assert w is not None and "--engine.dtype bfloat16" in w
    assert precision.emulation_warning(bf16, "auto", AMX) is None
    assert precision.emulation_warning(bf16, "auto", frozenset({"avx2", "avx512f", "avx512_bf16"})) is None  # Zen 4
    assert precision.emulation_warning(fp32, "auto", NO_AMX) is None
    assert precision.emulation_warning(fp32, "float32", NO_AMX) is None
    assert precision.emulation_warning(precision.decide("bf16", "cuda"), "auto", NO_AMX) is None
    assert precision.bf16_slowdown() > 0  # measured on this machine


def test_a_run_asking_for_bf16_where_it_is_emulated_starts_with_the_warning(monkeypatch):
    """run.py's start (`preflight.bf16_warning`, printed once by rank 0 in startup.py) on a CPU without bf16 units."""
    from nanosky import preflight
    from nanosky.cli import parse_args

    monkeypatch.setattr(precision, "cpu_flags", lambda: NO_AMX)
    w = preflight.bf16_warning(parse_args(["--precision", "bf16"], console=False))
    assert w is not None and "--precision bf16" in w and "emulated" in w
    assert preflight.bf16_warning(parse_args(["--precision", "auto"], console=False)) is None  # auto: fp32 there
    monkeypatch.setattr(precision, "cpu_flags", lambda: AMX)
    assert preflight.bf16_warning(parse_args(["--precision", "bf16"], console=False)) is None


def test_the_cpu_flags_can_be_those_of_another_cpu(monkeypatch):
    """NANOSKY_CPU_FLAGS stands in for /proc/cpuinfo's flags (read once a process): an AVX2-only box's path here."""
    try:
        monkeypatch.setenv("NANOSKY_CPU_FLAGS", "avx2 fma")
        precision.cpu_flags.cache_clear()
        assert precision.cpu_flags() == {"avx2", "fma"} and not precision.has_bf16_units()
        assert precision.decide("auto", "cpu").name == "fp32"
        monkeypatch.setenv("NANOSKY_CPU_FLAGS", "avx2 avx512f avx512_bf16")
        precision.cpu_flags.cache_clear()
        assert precision.decide("auto", "cpu").name == "bf16"
    finally:
        precision.cpu_flags.cache_clear()  # read again after monkeypatch restores the environment: the tests after
