"""flash_kda: Kimi Delta Attention (KDA) forward and backward for Hopper GPUs, and its fp64 CPU reference.

The function computed is defined in docs/kda-spec.md (Kimi Linear, arXiv 2510.26692;
fla.ops.kda.chunk_kda). Public API:

- :func:`fwd`: MoonshotAI FlashKDA's ``fwd`` call on torch CUDA tensors (sm_90).
- :func:`chunk_kda`: the same forward with fla 0.6.0's ``chunk_kda`` call (every gate mode and
  flag the kernels serve), differentiable (the backward of include/flash_kda/backward.h runs in
  ``loss.backward()``); also registered with fla's backend registry for fla's own
  ``chunk_kda`` when fla 0.6.x is installed (in place of fla's built-in FlashKDA backend),
  training calls included with FLA_FLASH_KDA_TRAIN=1. Both run as the torch.library op
  flash_kda::forward under torch.compile; a training call as flash_kda::chunk_kda_train with
  flash_kda::chunk_kda_backward.
- :func:`fused_recurrent_kda_fwd`, :func:`fused_recurrent_kda`: the decode step over a state
  pool (T = 1..16 tokens per sequence) with fla 0.6.0's call; also registered with fla's
  backend registry (operation 'kda') when fla 0.6.x is installed, and as the torch.library op
  flash_kda::fused_recurrent_kda_fwd.
- :func:`reference_decode`: the decode's exact fp64 CPU reference.
- :class:`LaunchOptions`: launch choices fwd may be given instead of the plan's.
- :class:`DecodeLaunchOptions`: which decode kernel fused_recurrent_kda_fwd runs.
- :func:`reference`: the exact fp64 CPU reference on numpy arrays or torch tensors.
- :func:`autograd_reference`: the gradient yardstick: the same function in fp64 torch
  operations on the inputs' device, differentiable by torch.autograd, with chunk_kda's call.
- :class:`Error`: raised for invalid or unsupported arguments (a ValueError).
- :func:`cuda_available`, ``__version__``.

The package imports without PyTorch; only :func:`fwd`, :func:`chunk_kda`, the decode's GPU
functions and :func:`autograd_reference` need it.
"""

_have_torch = True
try:
    # torch must be loaded before the extension: with flash_kda._core (static CUDA runtime)
    # loaded first, `import torch` crashed on the H200 image (torch 2.11, cu130). The package
    # still imports without torch.
    import torch  # noqa: F401
except ImportError:
    _have_torch = False

from . import _core  # noqa: E402
from ._forward import LaunchOptions, fwd
from ._chunk import chunk_kda
from ._decode import DecodeLaunchOptions, fused_recurrent_kda, fused_recurrent_kda_fwd, reference_decode
from ._reference import reference
from ._autograd_reference import autograd_reference  # imports torch when called, not here

__version__: str = _core.__version__

Error = _core.Error
Error.__module__ = __name__


def cuda_available() -> bool:
    """True when this build has its CUDA kernels and an sm_90 (Hopper) GPU is visible.

    Asks the CUDA runtime directly (no PyTorch needed); returns False on machines without a
    driver or device, and for CPU-only builds (FLASH_KDA_CUDA=OFF). Never raises.
    """
    try:
        return bool(_core.cuda_available())
    except Exception:  # noqa: BLE001 - documented never to raise
        return False


if _have_torch:
    try:
        from . import _ops  # noqa: F401  (registers the torch.library ops flash_kda::forward, ::fused_recurrent_kda_fwd)
    except Exception:  # noqa: BLE001 - a torch without torch.library.custom_op: eager calls still work
        pass

from . import _fla, _fla_chunk  # noqa: E402

_fla.register()  # never raises; flash_kda._fla.status says whether fla dispatches to the decode
_fla_chunk.register()  # never raises; flash_kda._fla_chunk.status: whether fla's chunk_kda dispatches here

__all__ = ["DecodeLaunchOptions", "Error", "LaunchOptions", "__version__", "autograd_reference", "chunk_kda", "cuda_available", "fused_recurrent_kda",
           "fused_recurrent_kda_fwd", "fwd", "reference", "reference_decode"]
