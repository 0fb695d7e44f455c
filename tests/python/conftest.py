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
