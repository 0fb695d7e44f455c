"""What the benchmark needs from the machine, and what it records about it."""

from __future__ import annotations

import datetime
import importlib
import importlib.metadata
import platform
import subprocess

#: The one sentence printed (then exit code 2) when the machine cannot run the benchmark.
NEED = ("flash_kda.bench needs an NVIDIA Hopper GPU (sm_90, e.g. H100/H200) visible to a "
        "CUDA build of PyTorch and flash_kda built with its CUDA kernels")


def unmet_requirement() -> str | None:
    """None when this machine can run the benchmark, else one sentence saying what is missing.

    Checks, in order: torch importable, a CUDA device visible, compute capability 9.0,
    flash_kda importable with flash_kda.cuda_available() true. Never raises.
    """
    try:
        import torch
    except Exception:
        return f"{NEED}; PyTorch is not installed here."
    try:
        if not torch.cuda.is_available():
            return f"{NEED}; no CUDA device is visible here."
        cap = torch.cuda.get_device_capability()
        name = torch.cuda.get_device_name()
    except Exception as e:  # a broken driver reports through here
        return f"{NEED}; CUDA could not be initialised ({type(e).__name__}: {e})."
    if tuple(cap) != (9, 0):
        return f"{NEED}; the visible GPU is {name} (sm_{cap[0]}{cap[1]})."
    try:
        fk = importlib.import_module("flash_kda")
        ok = bool(fk.cuda_available())
    except Exception as e:
        return f"{NEED}; flash_kda could not be loaded ({type(e).__name__}: {e})."
    if not ok:
        return f"{NEED}; this flash_kda build has no CUDA kernels (flash_kda.cuda_available() is False)."
    return None


def _version(dist: str, module: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return str(getattr(importlib.import_module(module), "__version__", "unknown"))
    except Exception:
        return "not installed"


def driver_version() -> str:
    """NVIDIA driver version from nvidia-smi, or "unknown" when it cannot be asked."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20, check=True)
        return r.stdout.strip().splitlines()[0]
    except Exception:
        return "unknown"


def collect_meta() -> dict:
    """GPU name, SM count, driver, CUDA runtime, library versions and the date (call on a GPU host)."""
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    import flash_kda

    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "driver": driver_version(),
        "cuda_runtime": torch.version.cuda,
        "torch": torch.__version__,
        "triton": _version("triton", "triton"),
        "fla": _version("fla-core", "fla"),
        "flash_kda": str(getattr(flash_kda, "__version__", "unknown")),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def fla_available() -> bool:
    """True when flash-linear-attention's chunk_kda can be imported."""
    try:
        importlib.import_module("fla.ops.kda")
        return True
    except Exception:
        return False


def fla_layer_unavailable() -> str | None:
    """None when fla's KimiDeltaAttention layer (fla.layers.kda, in the flash-linear-attention
    package; fla-core alone has only fla.ops) imports, else one sentence saying why --layer
    cannot run. Never raises."""
    try:
        importlib.import_module("fla.layers.kda")
        return None
    except Exception as e:
        return ("--layer needs fla's KimiDeltaAttention layer (fla.layers.kda, pip install "
                f"flash-linear-attention), which could not be imported here ({type(e).__name__}: "
                f"{' '.join(str(e).split())}).")
