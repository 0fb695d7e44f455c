"""CLI flags of `python -m flash_kda.bench` (CPU only: nothing here touches torch)."""

import argparse

import pytest

import _bench_path  # noqa: F401
from flash_kda_bench import cli
from flash_kda_bench.cases import MIXED_SEQLENS


def test_defaults_are_the_standard_suite():
    a = cli.parse_args([])
    assert [c.name for c in a.cases][:3] == ["h96_fixed_8192", "h96_mixed_varlen", "h96_uniform_1024x8"]
    assert len(a.cases) == 13
    assert all(c.state == "fp32" for c in a.cases)
    assert (a.iters, a.warmup, a.no_fla, a.no_check, a.layer, a.write_record) == (100, 10, False, False, False, False)
    assert a.markdown is None
    assert str(a.out_dir) == "bench-out"


@pytest.mark.parametrize("text, expected", [
    ("1300,547,2048,963,271,3063", list(MIXED_SEQLENS)),
    ("7", [7]),
    (" 16 , 1 ", [16, 1]),
])
def test_parse_seqlens(text, expected):
    assert cli.parse_seqlens(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("", "comma-separated"),
    ("12,,4", "comma-separated"),
    ("12,x", "'x' is not an integer"),
    ("12,0", "must be >= 1"),
    ("-3", "must be >= 1"),
    ("1.5", "not an integer"),
])
def test_parse_seqlens_errors(text, fragment):
    with pytest.raises(argparse.ArgumentTypeError, match=fragment):
        cli.parse_seqlens(text)


def test_bad_seqlens_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["--seqlens", "5,zero"])
    assert e.value.code == 2
    assert "'zero' is not an integer" in capsys.readouterr().err


def test_custom_varlen_case():
    a = cli.parse_args(["--seqlens", "1300,547", "--heads", "64", "--state", "bf16"])
    (c,) = a.cases
    assert (c.heads, c.seqlens, c.state, c.total_tokens, c.num_seqs) == (64, (1300, 547), "bf16", 1847, 2)
    assert c.cu_seqlens() == [0, 1300, 1847]
    assert c.name == "h64_varlen_2x1847"


def test_custom_fixed_batch_case():
    a = cli.parse_args(["--T", "2048", "--batch", "16", "--heads", "32", "--state", "none"])
    (c,) = a.cases
    assert (c.T, c.batch, c.heads, c.varlen, c.total_tokens, c.state) == (2048, 16, 32, False, 32768, "none")
    assert c.name == "h32_batch16_2048"


def test_custom_case_default_heads():
    (c,) = cli.parse_args(["--T", "512"]).cases
    assert (c.heads, c.T, c.batch) == (96, 512, 1)


def test_cases_by_name_keep_order():
    a = cli.parse_args(["--cases", "h4_fixed_1024,h96_fixed_512", "--iters", "7", "--warmup", "3",
                        "--no-fla", "--no-check", "--markdown", "x.md", "--out-dir", "o"])
    assert [c.name for c in a.cases] == ["h4_fixed_1024", "h96_fixed_512"]
    assert (a.iters, a.warmup, a.no_fla, a.no_check, str(a.markdown), str(a.out_dir)) == (7, 3, True, True, "x.md", "o")


@pytest.mark.parametrize("argv, fragment", [
    (["--cases", "h4_fixed_1024,nope"], "unknown case(s) nope"),
    (["--cases", "h4_fixed_1024", "--T", "16"], "do not combine"),
    (["--heads", "8"], "give --T or --seqlens"),
    (["--seqlens", "4,4", "--batch", "2"], "--batch cannot be combined"),
    (["--seqlens", "4,4", "--T", "9"], "disagrees with sum"),
    (["--state", "fp16"], "invalid choice"),
    (["--iters", "0"], "must be >= 1"),
    (["--T", "abc"], "not an integer"),
])
def test_flag_errors_exit_2(argv, fragment, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(argv)
    assert e.value.code == 2
    assert fragment in capsys.readouterr().err


def test_repo_root_finds_the_checkout():
    root = cli.repo_root()
    assert (root / "include" / "flash_kda" / "forward.h").is_file()
    assert root == _bench_path.REPO


def test_layer_flags():
    a = cli.parse_args(["--layer", "--T", "4096", "--batch", "2"])
    assert (a.layer, a.T, a.batch) == (True, 4096, 2)
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["--layer", "--T", "64"])
    assert e.value.code == 2


def test_layer_rejects_heads(capsys):
    # The layer has Kimi Linear's 32 heads; a silently ignored --heads would mislead.
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["--layer", "--heads", "8"])
    assert e.value.code == 2
    assert "--heads does not apply to --layer" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--T", "1024"], ["--cases", "h4_fixed_1024"], ["--layer"]])
def test_from_json_takes_no_case_flags(capsys, extra):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["--from-json", "r.json", *extra])
    assert e.value.code == 2
    assert "--from-json re-renders an earlier run" in capsys.readouterr().err
