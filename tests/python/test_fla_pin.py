"""fwd_cases.pin_fla_configs: fla's autotuned kernels named in fla_configs.json end up with
exactly that one configuration (so the GPU suite skips fla's autotuning), others are left alone,
and FLASH_KDA_TEST_FLA_AUTOTUNE=1 turns it off. Needs triton (not a GPU): skipped without it."""
import json
import sys
import types

import pytest

import fwd_cases


@pytest.fixture(autouse=True)
def _fresh_pin_cache():
    """pin_fla_configs is cached per process: these tests must not see an earlier real result,
    nor leave their fake one to later tests in the same (xdist) worker."""
    fwd_cases.pin_fla_configs.cache_clear()
    yield
    fwd_cases.pin_fla_configs.cache_clear()


def _fake_fla_module(monkeypatch, triton):
    import triton.language as tl

    # Only the fakes below may be seen: real fla modules loaded by other tests in this process
    # would be pinned (and counted) too. monkeypatch puts them back afterwards.
    for name in [n for n in sys.modules if n.startswith("fla.")]:
        monkeypatch.delitem(sys.modules, name)

    configs = [triton.Config({"BK": 16, "BV": 16}, num_warps=2, num_stages=1),
               triton.Config({"BK": 32, "BV": 32}, num_warps=8, num_stages=2)]

    @triton.autotune(configs=list(configs), key=["n"])
    @triton.jit
    def chunk_gla_fwd_kernel_o(x, n, BK: tl.constexpr, BV: tl.constexpr):
        pass

    @triton.autotune(configs=list(configs), key=["n"])
    @triton.jit
    def some_kernel_not_in_the_file(x, n, BK: tl.constexpr, BV: tl.constexpr):
        pass

    # As fla writes most of its kernels: heuristics around the autotuner, and l2norm's kernel
    # lives in fla.modules, not fla.ops.
    @triton.heuristics({"USE_X": lambda args: args["x"] is not None})
    @triton.autotune(configs=list(configs), key=["n"])
    @triton.jit
    def l2norm_fwd_kernel(x, n, BK: tl.constexpr, BV: tl.constexpr, USE_X: tl.constexpr):
        pass

    mod = types.ModuleType("fla.ops.fake_for_pin_test")
    mod.chunk_gla_fwd_kernel_o = chunk_gla_fwd_kernel_o
    mod.some_kernel_not_in_the_file = some_kernel_not_in_the_file
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    mod2 = types.ModuleType("fla.modules.fake_for_pin_test")
    mod2.l2norm_fwd_kernel = l2norm_fwd_kernel
    monkeypatch.setitem(sys.modules, mod2.__name__, mod2)
    mod.wrapped = l2norm_fwd_kernel
    return mod


def test_named_kernels_get_the_file_config(monkeypatch):
    triton = pytest.importorskip("triton")
    monkeypatch.delenv("FLASH_KDA_TEST_FLA_AUTOTUNE", raising=False)
    mod = _fake_fla_module(monkeypatch, triton)
    with open(fwd_cases.FLA_CONFIGS) as f:
        want = json.load(f)["kernels"]["chunk_gla_fwd_kernel_o"]
    assert fwd_cases.pin_fla_configs() == 2  # the l2norm kernel is seen twice but pinned once
    (c,) = mod.chunk_gla_fwd_kernel_o.configs
    assert (c.kwargs, c.num_warps, c.num_stages) == (want["kwargs"], want["num_warps"], want["num_stages"])
    assert len(mod.some_kernel_not_in_the_file.configs) == 2
    with open(fwd_cases.FLA_CONFIGS) as f:
        want_l2 = json.load(f)["kernels"]["l2norm_fwd_kernel"]
    (c,) = mod.wrapped.fn.configs  # the Autotuner inside the heuristics
    assert (c.kwargs, c.num_warps) == (want_l2["kwargs"], want_l2["num_warps"])


def test_autotune_env_leaves_fla_alone(monkeypatch):
    triton = pytest.importorskip("triton")
    monkeypatch.setenv("FLASH_KDA_TEST_FLA_AUTOTUNE", "1")
    mod = _fake_fla_module(monkeypatch, triton)
    assert fwd_cases.pin_fla_configs() == 0
    assert len(mod.chunk_gla_fwd_kernel_o.configs) == 2
