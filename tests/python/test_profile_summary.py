"""scripts/profile_summary.py: reads an ncu source-page CSV and totals stall samples per reason
and per opcode (no GPU, no ncu: a hand-written three-instruction page)."""
import importlib.util
import os

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "profile_summary.py")
_spec = importlib.util.spec_from_file_location("profile_summary", _PATH)
profile_summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile_summary)

PAGE = '''"Kernel Name","recurrence_kernel<8>",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait","stall_short_sb","stall_wait (Not Issued)"
"0x10","      HMMA.16816.F32.BF16 R1, R2, R3, R1","30","100","10","20","5"
"0x20","      @!P0  HMMA.16816.F32.BF16 R4, R2, R3, R4","10","100","10","0","5"
"0x30","      LDSM.16.M88.4 R8, [R9]","60","50","0","60","0"
'''


def test_totals_per_reason_and_opcode():
    rows = profile_summary.read_rows(PAGE.splitlines())
    assert len(rows) == 3
    s = profile_summary.summarise(rows)
    assert s["total"] == 100
    assert dict(s["stalls"]) == {"wait": 20, "short_sb": 80}  # "(Not Issued)" columns are not counted twice
    assert s["ops_samples"] == {"HMMA": 40, "LDSM": 60}
    assert s["ops_exec"] == {"HMMA": 200, "LDSM": 50}


REGIONS_PAGE = '''"Kernel Name","recurrence_kernel<4>",
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_wait","stall_barrier"
"0x40","      F2FP.BF16.F32.PACK_AB R1, R2, R3","4","64","4","0"
"0x10","      MOV R1, R2","1","8","1","0"
"0x20","      BAR.SYNC.DEFER_BLOCKING 0x0","30","64","0","30"
"0x30","      FMUL R4, R4, R5","5","64","5","0"
"0x50","      WARPGROUP.DEPBAR.LE gsb0, 0x0","50","64","10","0"
"0x60","      FADD R6, R6, R7","10","64","10","0"
'''


def test_regions_split_at_sync_points_in_address_order():
    rows = profile_summary.read_rows(REGIONS_PAGE.splitlines())
    g = profile_summary.regions(rows)
    assert [r["address"] for r in g] == ["0x10", "0x20", "0x50"]  # sorted by address, not by row order
    assert [r["samples"] for r in g] == [1, 39, 60]
    assert [r["entered"] for r in g] == [8, 64, 64]
    assert g[1]["stalls"]["barrier"] == 30 and g[1]["stalls"]["wait"] == 9
    assert g[2]["source"].startswith("WARPGROUP.DEPBAR")


def test_predicated_opcode():
    assert profile_summary.opcode("@!P0  HMMA.16816.F32.BF16 R4, R2, R3, R4") == "HMMA"
    assert profile_summary.opcode("  BAR.SYNC.DEFER_BLOCKING 0x0") == "BAR"


def test_not_a_source_page_is_an_error():
    with pytest.raises(ValueError, match="stall sampling"):
        profile_summary.read_rows(['"Address","Source"', '"0x10","NOP"'])


def test_main_prints_the_region_table(tmp_path, capsys):
    page = tmp_path / "recurrence-sass.csv"
    page.write_text(REGIONS_PAGE)
    assert profile_summary.main([str(page), "--top", "2"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("regions from a sync point"):].splitlines()[1:]
    assert len(table) == 2  # --top rows, the largest first
    assert table[0].split()[0] == "60.0%" and "WARPGROUP.DEPBAR" in table[0]
    assert table[1].split()[0] == "39.0%" and "barrier 77%" in table[1]
