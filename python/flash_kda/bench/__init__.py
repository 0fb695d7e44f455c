"""`python -m flash_kda.bench`: the benchmark users run to decide (see docs/benchmark.md).

Modules: cli (flags), cases (suite, HBM floor bytes), anchors (peer numbers from
anchors-h200.md), inputs, impls (flash_kda and fla callables), check (fp64 reference
comparison), timing (CUDA events, graphs, copy bandwidth), suite (the per-case loop),
layer (--layer), decode (--decode: the decode sweep against fla's fused_recurrent_kda_fwd),
report (tables, JSON, Markdown), plotting (PNG), environment (GPU check).
Importing this package needs neither torch nor a GPU.
"""

from .main import main

__all__ = ["main"]
