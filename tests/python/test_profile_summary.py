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


def test_predicated_opcode():
    assert profile_summary.opcode("@!P0  HMMA.16816.F32.BF16 R4, R2, R3, R4") == "HMMA"
    assert profile_summary.opcode("  BAR.SYNC.DEFER_BLOCKING 0x0") == "BAR"


def test_not_a_source_page_is_an_error():
    with pytest.raises(ValueError, match="stall sampling"):
        profile_summary.read_rows(['"Address","Source"', '"0x10","NOP"'])
