"""Running the benchmark on part of the GPU: a CUDA green context of a given number of SMs.

The smaller sm_90 parts (H20: 78 SMs, H100 PCIe: 114) are modelled on an H200 by a green
context (`torch.cuda.green_contexts`, the driver's cuGreenCtxCreate), which really confines the
kernels launched on its stream to that many SMs. Hopper hands out SMs in groups of 8, so the
nearest counts the driver allows are used: 80 for an H20, 112 for an H100 PCIe. flash_kda's
launch plan is told the same count (`LaunchOptions(num_sms=...)`), so that it sizes its grids
and waves as it would on such a part; fla is not told anything (it reads no SM count).
"""

from __future__ import annotations

import functools

#: SMs a green context's partition is a multiple of on sm_90 (the driver's SM group size).
SM_GRANULE = 8


class Partition:
    """A green context of `num_sms` SMs on the current device and a torch stream inside it.

    Work enqueued on `stream` runs on those SMs only. The context lives as long as this object.
    Raises ValueError for a count that is not a positive multiple of SM_GRANULE or exceeds the
    device's SMs, RuntimeError when this PyTorch has no green-context support.
    """

    def __init__(self, num_sms: int):
        import torch

        total = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        if num_sms <= 0 or num_sms % SM_GRANULE or num_sms > total:
            raise ValueError(f"--num-sms must be a multiple of {SM_GRANULE} in [{SM_GRANULE}, {total}] "
                             f"(the driver's SM groups on this device), got {num_sms}")
        try:
            from torch.cuda.green_contexts import GreenContext
        except ImportError as e:
            raise RuntimeError(f"--num-sms needs torch.cuda.green_contexts (PyTorch >= 2.9): {e}") from e
        self.num_sms = num_sms
        self.context = GreenContext.create(num_sms, torch.cuda.current_device())
        self.stream = self.context.Stream()


def _matmul_ms(stream, n: int = 8192, iters: int = 20) -> float:
    import torch

    from . import timing

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    with torch.cuda.stream(stream):
        times = timing.time_eager(functools.partial(torch.matmul, a, b), 3, iters)
    return sorted(times)[len(times) // 2]


def confinement(partition: Partition) -> dict:
    """Evidence that the partition confines work: the median time of a bf16 8192^3 matmul
    (compute-bound, spread over every SM it may use) on the whole device and on the partition.
    Their ratio comes out near total_sms / num_sms when the confinement is real (measured on
    an H200: 1.59 at 80 SMs, 1.13 at 120)."""
    import torch

    full = _matmul_ms(torch.cuda.current_stream())
    part = _matmul_ms(partition.stream)
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return {"num_sms": partition.num_sms, "device_sms": total, "matmul_ms_device": full,
            "matmul_ms_partition": part, "ratio": part / full, "sm_ratio": total / partition.num_sms}
