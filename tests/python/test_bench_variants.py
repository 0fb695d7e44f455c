"""The benchmark's variants (--gate, --state-layout, --state-dtypes, --strided) and entry points
(--entry): flags, the floor, the report's sections, and which flash_kda function is timed (CPU
only: fake results and stand-ins for torch and flash_kda)."""

import json
import sys
import types

import pytest

import _bench_path  # noqa: F401
from flash_kda_bench import check, cli, impls, report
from flash_kda_bench.inputs import Inputs
from flash_kda_bench.cases import Case, floor_ms, hbm_floor_bytes

BW = 4.0e12


def test_gate_list_runs_every_case_once_per_gate_in_order():
    a = cli.parse_args(["--gate", "safe,softplus", "--cases", "h4_fixed_1024,h96_fixed_512"])
    assert [(c.name, c.gate) for c in a.cases] == [
        ("h4_fixed_1024", "safe"), ("h96_fixed_512", "safe"),
        ("h4_fixed_1024", "softplus"), ("h96_fixed_512", "softplus")]
    assert [c.plain for c in a.cases] == [True, True, False, False]


def test_layout_dtypes_and_strided_reach_every_case():
    a = cli.parse_args(["--state-layout", "k_first", "--state-dtypes", "bf16,fp32", "--strided"])
    assert len(a.cases) == 13
    c = a.cases[0]
    assert (c.state_layout, c.state, c.state_out, c.final_state_dtype, c.strided) == ("k_first", "bf16", "fp32", "fp32", True)
    assert not c.plain
    assert c.variant_label() == "safe gate, k-first states, bf16 -> fp32 states, strided q/k/v (views of a fused projection)"


def test_equal_state_dtypes_are_not_a_variant():
    c = cli.parse_args(["--state-dtypes", "bf16,bf16", "--cases", "h4_fixed_1024"]).cases[0]
    assert c.state == "bf16" and c.state_out is None and c.plain


@pytest.mark.parametrize("argv", [
    ["--gate", "sigmoid"], ["--gate", "safe,safe"], ["--gate", ""],
    ["--state-dtypes", "bf16"], ["--state-dtypes", "fp16,fp32"], ["--state-dtypes", "fp32,bf16,fp32"],
    ["--state-layout", "kv"],
    ["--state", "bf16", "--state-dtypes", "bf16,fp32"],
    ["--decode", "--gate", "softplus"], ["--decode", "--strided"],
    ["--layer", "--gate", "softplus"],
    ["--state-dtypes", "fp32,bf16"], ["--gate", "softplus", "--state", "bf16"], ["--strided", "--state", "bf16"],
])
def test_bad_variant_flags_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_floor_of_the_variants():
    base = dict(name="x", heads=4, T=256)
    safe = hbm_floor_bytes(Case(**base))
    tokens_g = 256 * 4 * 128
    # The pre-computed gate reads g in fp32 (2 more bytes an element) and no A_log / dt_bias.
    assert hbm_floor_bytes(Case(**base, gate="pre")) == safe + 2 * tokens_g - (4 * 4 + 4 * 128 * 4)
    assert hbm_floor_bytes(Case(**base, gate="softplus")) == safe
    state = 4 * 128 * 128
    assert hbm_floor_bytes(Case(**base, state="bf16", state_out="fp32")) == safe - 2 * state
    assert hbm_floor_bytes(Case(**base, strided=True)) == safe
    assert hbm_floor_bytes(Case(**base, state_layout="k_first")) == safe


def _times(median):
    return {"median": median, "min": median, "max": median, "n": 3}


def _result(case, ours, fla=None, graph=None):
    times = {"flash_kda": {"eager": _times(ours)}}
    if graph is not None:
        times["flash_kda"]["graph"] = _times(graph)
    if fla is not None:
        times["fla"] = {"eager": _times(fla)}
    chk = {"heads": "all", "out_err": 2e-3, "state_err": 1e-3, "bound": 1e-2, "fla_ratio_bound": 1.5}
    chk["passed"] = check.verdict(chk)
    return {"case": case.to_dict(), "floor_bytes": hbm_floor_bytes(case), "floor_ms": floor_ms(case, BW),
            "anchor": None, "times": times, "errors": {}, "check": chk}


def _two_gates():
    a, b = Case("h4_fixed_1024", 4, T=1024), Case("h96_fixed_512", 96, T=512)
    soft = [Case(c.name, c.heads, T=c.T, gate="softplus") for c in (a, b)]
    cases = [_result(a, 0.010, 0.05), _result(b, 0.100, 0.40), _result(soft[0], 0.011, 0.08),
             _result(soft[1], 0.125, 0.60)]
    return {"meta": {}, "copy_bandwidth": BW, "anchor_source": "test", "settings": {}, "cases": cases}


def test_sections_per_variant_with_the_cost_of_the_gate():
    text = report.format_table(_two_gates())
    assert "== safe gate, v-first states ==" in text and "== softplus gate, v-first states ==" in text
    assert text.index("== safe gate") < text.index("== softplus gate")
    # 0.011 / 0.010 and 0.125 / 0.100: the worst is h96_fixed_512 at 1.25x.
    assert ("softplus gate, v-first states: flash_kda time / safe-gate v-first time: eager max 1.25x "
            "(h96_fixed_512)") in text
    assert f"geomean {((0.011 / 0.010) * (0.125 / 0.100)) ** 0.5:.2f}x over 2 case(s)" in text
    assert "graph max" not in text  # no case was graph-timed
    # The softplus section's own means: flash_kda and fla over both cases.
    assert f"fla / flash_kda {((0.08 * 0.60) ** 0.5) / ((0.011 * 0.125) ** 0.5):.2f}x" in text


def test_cost_line_gives_the_graph_ratio_beside_the_eager_one():
    a, b = Case("h4_fixed_1024", 4, T=1024), Case("h96_fixed_512", 96, T=512)
    soft = [Case(c.name, c.heads, T=c.T, gate="softplus") for c in (a, b)]
    # Eager: chunk_kda's host time doubles the small case; graph: the kernels cost 5% and 10% more.
    cases = [_result(a, 0.040, graph=0.038), _result(b, 0.060, graph=0.059),
             _result(soft[0], 0.080, graph=0.038 * 1.05), _result(soft[1], 0.066, graph=0.059 * 1.10)]
    r = {"meta": {}, "copy_bandwidth": BW, "anchor_source": "test", "settings": {}, "cases": cases}
    (line,) = report.variant_cost_lines(r)
    assert line.startswith("softplus gate, v-first states: flash_kda time / safe-gate v-first time: "
                           "eager max 2.00x (h4_fixed_1024)")
    assert "; graph max 1.10x (h96_fixed_512), geomean " + f"{(1.05 * 1.10) ** 0.5:.2f}x over 2 case(s)" in line


def test_markdown_sections_and_readme_table_keeps_flashkda_configuration():
    r = _two_gates()
    md = report.to_markdown(r)
    assert "## Safe gate, v-first states" in md and "## Softplus gate, v-first states" in md
    table = report.readme_table(r)
    names = [line.split("|")[1].strip() for line in table[2:-1]]
    assert names == ["h4_fixed_1024", "h96_fixed_512"]  # the softplus rows are not the README's


def test_one_plain_variant_keeps_the_unsectioned_table():
    r = _two_gates()
    r["cases"] = r["cases"][:2]
    text = report.format_table(r)
    assert "==" not in text and text.splitlines()[0].split()[0] == "case"
    assert report.variant_cost_lines(r) == []


def test_old_records_read_as_flashkda_configuration():
    c = Case("h4_fixed_1024", 4, T=1024).to_dict()
    for key in ("gate", "state_layout", "state_out", "strided"):
        c.pop(key)
    assert report.is_plain(report.variant_of(c))


# --- --entry: FlashKDA's configuration through chunk_kda, so an A/B times one entry point ----------


def test_entry_defaults_to_fwd_for_flashkda_configuration_and_chunk_kda_for_variants():
    a = cli.parse_args(["--gate", "safe,softplus", "--cases", "h4_fixed_1024"])
    assert [(c.gate, c.entry, c.plain) for c in a.cases] == [("safe", "fwd", True), ("softplus", "chunk_kda", False)]
    assert cli.parse_args(["--strided", "--cases", "h4_fixed_1024"]).cases[0].entry == "chunk_kda"
    assert cli.parse_args(["--entry", "fwd", "--cases", "h4_fixed_1024"]).cases[0].entry == "fwd"


def test_entry_chunk_kda_takes_flashkda_configuration_out_of_plain():
    a = cli.parse_args(["--entry", "chunk_kda", "--gate", "safe,softplus", "--cases", "h4_fixed_1024"])
    safe, soft = a.cases
    assert (safe.gate, safe.entry, safe.flashkda_configuration, safe.plain) == ("safe", "chunk_kda", True, False)
    assert (soft.gate, soft.entry, soft.flashkda_configuration, soft.plain) == ("softplus", "chunk_kda", False, False)
    assert safe.variant_label() == "safe gate, v-first states, fp32 states, through chunk_kda"
    assert soft.variant_label() == "softplus gate, v-first states, fp32 states"  # every variant is chunk_kda's
    # --state none and a bf16 initial state with an fp32 final state are chunk_kda's to take.
    assert cli.parse_args(["--entry", "chunk_kda", "--state", "none", "--cases", "h4_fixed_1024"]).cases[0].state == "none"
    c = cli.parse_args(["--entry", "chunk_kda", "--state-dtypes", "bf16,fp32", "--cases", "h4_fixed_1024"]).cases[0]
    assert (c.entry, c.state, c.final_state_dtype) == ("chunk_kda", "bf16", "fp32")


@pytest.mark.parametrize("argv, fragment", [
    (["--entry", "fwd", "--strided"], "--entry fwd takes FlashKDA's configuration only"),
    (["--entry", "fwd", "--gate", "safe,softplus"], "--entry fwd takes FlashKDA's configuration only"),
    (["--entry", "fwd", "--state-layout", "k_first"], "--entry fwd takes FlashKDA's configuration only"),
    (["--entry", "fwd", "--state-dtypes", "bf16,fp32"], "--entry fwd takes FlashKDA's configuration only"),
    (["--entry", "chunk_kda", "--state", "bf16"], "--entry chunk_kda run flash_kda.chunk_kda"),
    (["--entry", "chunk_kda", "--state-dtypes", "fp32,bf16"], "--entry chunk_kda run flash_kda.chunk_kda"),
    (["--entry", "jit"], "invalid choice: 'jit'"),
    (["--decode", "--entry", "chunk_kda"], "not with --decode"),
    (["--layer", "--entry", "chunk_kda"], "not with --layer or --from-json"),
    (["--from-json", "results.json", "--entry", "fwd"], "not with --layer or --from-json"),
])
def test_bad_entry_flags_exit_2_naming_why(argv, fragment, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(argv)
    assert e.value.code == 2
    assert fragment in capsys.readouterr().err


def test_entry_is_in_the_json_case(tmp_path):
    (safe,) = cli.parse_args(["--entry", "chunk_kda", "--cases", "h4_fixed_1024"]).cases
    assert safe.to_dict()["entry"] == "chunk_kda"
    assert Case("h4_fixed_1024", 4, T=1024).to_dict()["entry"] == "fwd"
    r = {"meta": {}, "copy_bandwidth": BW, "anchor_source": "test", "settings": {}, "cases": [_result(safe, 0.012)]}
    report.write_json(r, tmp_path / "results.json")
    assert json.loads((tmp_path / "results.json").read_text())["cases"][0]["case"]["entry"] == "chunk_kda"


def _fwd_and_chunk_kda():
    a, b = Case("h4_fixed_1024", 4, T=1024), Case("h96_fixed_512", 96, T=512)
    through = [Case(c.name, c.heads, T=c.T, entry="chunk_kda") for c in (a, b)]
    cases = [_result(a, 0.010, 0.05, graph=0.009), _result(b, 0.100, 0.40, graph=0.098),
             _result(through[0], 0.030, 0.05, graph=0.009), _result(through[1], 0.104, 0.40, graph=0.098)]
    return {"meta": {}, "copy_bandwidth": BW, "anchor_source": "test", "settings": {}, "cases": cases}


def test_chunk_kda_entry_has_its_own_section_and_cost_line():
    r = _fwd_and_chunk_kda()
    groups = report.variant_groups(r)
    assert [v for v, _ in groups] == [("safe", "v_first", None, False, "fwd"), ("safe", "v_first", None, False, "chunk_kda")]
    assert [report.is_plain(v) for v, _ in groups] == [True, False]
    text = report.format_table(r)
    assert "== safe gate, v-first states ==" in text and "== safe gate, v-first states, through chunk_kda ==" in text
    (line,) = report.variant_cost_lines(r)
    # Eager: 0.030 / 0.010 = 3.00x on h4 (chunk_kda's host time); graph: the same kernels, 1.00x.
    assert line.startswith("safe gate, v-first states, through chunk_kda: flash_kda time / safe-gate v-first time: "
                           "eager max 3.00x (h4_fixed_1024)")
    assert "; graph max 1.00x" in line
    md = report.to_markdown(r)
    assert "## Safe gate, v-first states, through chunk_kda" in md
    assert "| h4_fixed_1024 (safe gate, v-first states, through chunk_kda) |" in md  # the accuracy table


def test_chunk_kda_entry_stays_out_of_the_readme_table_and_anchors():
    r = _fwd_and_chunk_kda()
    names = [line.split("|")[1].strip() for line in report.readme_table(r)[2:-1]]
    assert names == ["h4_fixed_1024", "h96_fixed_512"]
    assert report.readme_table(r)[-1].split("|")[2].strip() == "0.0316"  # (0.010 * 0.100) ** 0.5: fwd's rows only
    assert not Case("h4_fixed_1024", 4, T=1024, entry="chunk_kda").plain  # suite.run_case gives no anchor then


def test_variant_records_without_an_entry_read_as_chunk_kda():
    c = Case("h4_fixed_1024", 4, T=1024, gate="softplus").to_dict()
    c.pop("entry")
    assert report.variant_of(c) == ("softplus", "v_first", None, False, "chunk_kda")
    assert report.variant_of({**c, "entry": "chunk_kda"}) == report.variant_of(c)


class _Reshapes:
    def reshape(self, *shape):
        return ("flat", shape)


def _calls_of_flash_kda_fn(monkeypatch, case):
    """Which flash_kda function flash_kda_fn(x)'s call() runs for `case`, on stand-ins for
    torch and flash_kda: ("fwd" or "chunk_kda", its keyword arguments)."""
    seen = []
    fake_fk = types.SimpleNamespace(
        fwd=lambda *a, **kw: seen.append(("fwd", kw)),
        chunk_kda=lambda **kw: seen.append(("chunk_kda", kw)) or ("out", "final_state"),
        LaunchOptions=lambda **kw: kw)
    monkeypatch.setitem(sys.modules, "flash_kda", fake_fk)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(full_like=lambda t, v: ("nan", t)))
    x = Inputs(q="q", k="k", v="v", g="g", beta="beta", A_log="A_log", dt_bias=_Reshapes(), initial_state="h0",
               cu_seqlens=None, cu_seqlens_cpu=None, scale=128 ** -0.5, case=case)
    call, outputs = impls.flash_kda_fn(x)
    call()
    return seen, outputs()


def test_flash_kda_fn_runs_chunk_kda_for_the_chunk_kda_entry(monkeypatch):
    seen, outputs = _calls_of_flash_kda_fn(monkeypatch, Case("h4_fixed_1024", 4, T=1024, entry="chunk_kda"))
    assert [name for name, _ in seen] == ["chunk_kda"]
    kw = seen[0][1]
    assert (kw["q"], kw["initial_state"], kw["output_final_state"], kw["safe_gate"], kw["state_v_first"],
            kw["use_gate_in_kernel"], kw["lower_bound"]) == ("q", "h0", True, True, True, True, -5.0)
    assert outputs == ("out", "final_state")


def test_flash_kda_fn_runs_fwd_for_the_fwd_entry(monkeypatch):
    seen, outputs = _calls_of_flash_kda_fn(monkeypatch, Case("h4_fixed_1024", 4, T=1024))
    assert [name for name, _ in seen] == ["fwd"]
    assert seen[0][1]["initial_state"] == "h0" and seen[0][1]["final_state"] == ("nan", "h0")
    assert outputs == (("nan", "v"), ("nan", "h0"))


def test_flash_kda_fn_refuses_a_bf16_final_state_through_chunk_kda(monkeypatch):
    with pytest.raises(ValueError, match="chunk_kda returns an fp32 final state"):
        _calls_of_flash_kda_fn(monkeypatch, Case("h4_fixed_1024", 4, T=1024, state="bf16", entry="chunk_kda"))
