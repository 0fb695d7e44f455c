"""Shared pytest setup: the `cuda_sm90` marker and fixture for tests that need the GPU kernels.

GPU tests skip (with the reason) unless PyTorch sees a CUDA device of compute capability 9.0
and this flash_kda build has its CUDA kernels; everything else runs on any machine.
"""
from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=None)
def cuda_sm90_skip_reason() -> str | None:
    """Why the sm_90 tests cannot run here, or None when they can. Never raises."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device"
    caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    if (9, 0) not in caps:
        return f"needs an sm_90 (Hopper) GPU, found compute capabilities {caps}"
    import flash_kda

    if not flash_kda.cuda_available():
        return "flash_kda was built without its CUDA kernels (FLASH_KDA_CUDA=OFF)"
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--num-sms", type=int, default=None, metavar="N",
                     help="run the GPU tests on a CUDA green context of N SMs (a multiple of 8) with flash_kda's "
                     "plan told the same count: the forward as on a smaller sm_90 part (80 ~ H20, 112 ~ H100 PCIe)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda_sm90: needs PyTorch with CUDA and an sm_90 GPU (skipped otherwise)")
    config.addinivalue_line("markers", "large_memory: needs most of the GPU's memory; run it alone")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("cuda_sm90")]
    if marked and (reason := cuda_sm90_skip_reason()):
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def cuda_sm90():
    """The first sm_90 torch.device; skips the test (with the reason) when there is none."""
    reason = cuda_sm90_skip_reason()
    if reason:
        pytest.skip(reason)
    import torch

    index = next(i for i in range(torch.cuda.device_count()) if torch.cuda.get_device_capability(i) == (9, 0))
    return torch.device("cuda", index)


@pytest.fixture
def kernels_built():
    """Skips the test (with the reason) when this flash_kda build has no CUDA kernels
    (FLASH_KDA_CUDA=OFF): the C++ validation for the GPU then refuses every call by that reason
    alone, so the GPU's validation rules cannot be tested. No GPU is needed otherwise."""
    from flash_kda import _core

    if not _core.built_with_cuda:
        pytest.skip("this flash_kda build has no CUDA kernels (FLASH_KDA_CUDA=OFF): the sm_90 validation "
                    "refuses every call before its other rules")


@pytest.fixture(scope="session")
def _sm_partition(request):
    """With --num-sms N: the green context of N SMs the GPU tests run on (bench/partition.py)."""
    n = request.config.getoption("--num-sms")
    if n is None or cuda_sm90_skip_reason():
        return None
    from flash_kda.bench.partition import Partition

    return Partition(n)


@pytest.fixture(autouse=True)
def _on_sm_partition(request, _sm_partition, monkeypatch):
    """With --num-sms, a cuda_sm90 test runs on the partition's stream, and each flash_kda.fwd
    call that names no launch_options gets LaunchOptions(num_sms=N)."""
    if _sm_partition is None or request.node.get_closest_marker("cuda_sm90") is None:
        yield
        return
    import torch
    import flash_kda

    real = flash_kda.fwd

    def fwd(*args, **kwargs):
        kwargs.setdefault("launch_options", flash_kda.LaunchOptions(num_sms=_sm_partition.num_sms))
        return real(*args, **kwargs)

    monkeypatch.setattr(flash_kda, "fwd", fwd)
    with torch.cuda.stream(_sm_partition.stream):
        yield
