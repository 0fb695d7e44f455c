"""Standard suite construction and HBM-floor byte counting (CPU only)."""

import pytest

import _bench_path  # noqa: F401
from flash_kda_bench import anchors
from flash_kda_bench.cases import Case, floor_ms, hbm_floor_bytes, standard_suite

# name -> (T_total, H, number of sequences), the rows of anchors-h200.md.
EXPECTED = {
    "h96_fixed_8192": (8192, 96, 1),
    "h96_mixed_varlen": (8192, 96, 6),
    "h96_uniform_1024x8": (8192, 96, 8),
    "h64_fixed_8192": (8192, 64, 1),
    "h64_mixed_varlen": (8192, 64, 6),
    "h64_uniform_1024x8": (8192, 64, 8),
    "h32_fixed_8192": (8192, 32, 1),
    "h16_fixed_8192": (8192, 16, 1),
    "h8_fixed_32768": (32768, 8, 1),
    "h4_fixed_65536": (65536, 4, 1),
    "h4_fixed_1024": (1024, 4, 1),
    "h96_fixed_512": (512, 96, 1),
    "h32_batch16_2048": (32768, 32, 16),
}


def test_standard_suite_matches_the_anchor_table():
    suite = standard_suite()
    assert [c.name for c in suite] == list(EXPECTED)
    for c in suite:
        assert (c.total_tokens, c.heads, c.num_seqs) == EXPECTED[c.name], c.name
        assert (c.head_dim_k, c.head_dim_v, c.state) == (128, 128, "fp32")
    assert set(anchors.ANCHORS_MS) == set(EXPECTED)


def test_varlen_cases_have_the_anchor_seqlens():
    by = {c.name: c for c in standard_suite()}
    assert by["h96_mixed_varlen"].seqlens == (1300, 547, 2048, 963, 271, 3063)
    assert by["h64_mixed_varlen"].cu_seqlens() == [0, 1300, 1847, 3895, 4858, 5129, 8192]
    assert by["h64_uniform_1024x8"].cu_seqlens() == [1024 * i for i in range(9)]
    assert by["h32_batch16_2048"].varlen is False and by["h32_batch16_2048"].batch == 16
    assert by["h32_batch16_2048"].cu_seqlens() is None


def test_state_choice_reaches_every_case():
    assert {c.state for c in standard_suite("bf16")} == {"bf16"}


def test_floor_bytes_by_hand_h96_fixed_8192():
    c = Case("h96_fixed_8192", 96, T=8192)
    per_tensor = 8192 * 96 * 128 * 2  # one bf16 [1, 8192, 96, 128] tensor
    assert per_tensor == 201_326_592
    # q, k, v, g read + out written; beta bf16; A_log, dt_bias fp32; fp32 state read + written.
    expected = 5 * per_tensor + 8192 * 96 * 2 + 96 * 4 + 96 * 128 * 4 + 2 * 1 * 96 * 128 * 128 * 4
    assert expected == 1_020_838_272
    assert hbm_floor_bytes(c) == expected


def test_floor_bytes_state_dtypes_and_sequences():
    base = dict(name="x", heads=4, seqlens=(100, 28))
    none, bf16, fp32 = (hbm_floor_bytes(Case(**base, state=s)) for s in ("none", "bf16", "fp32"))
    one_state = 2 * 4 * 128 * 128  # 2 sequences x 4 heads x V x K elements
    assert bf16 - none == 2 * one_state * 2
    assert fp32 - none == 2 * one_state * 4
    assert none == 128 * 4 * 128 * 5 * 2 + 128 * 4 * 2 + 4 * 4 + 4 * 128 * 4


@pytest.mark.parametrize("name", list(EXPECTED))
def test_floor_reproduces_the_anchor_floor(name):
    # anchors-h200.md divides the same byte count by its 4.27 TB/s copy bandwidth.
    c = {c.name: c for c in standard_suite()}[name]
    ours = floor_ms(c, anchors.ANCHOR_COPY_BANDWIDTH)
    published = anchors.anchor_for(name)["floor_ms"]
    # The table shows 3 decimals (2 significant digits for h4_fixed_1024): within one unit of
    # the last shown digit, or 5% for the sub-0.01 ms floor.
    if published < 0.01:
        assert ours == pytest.approx(published, rel=0.05)
    else:
        assert abs(ours - published) <= 1e-3


def test_anchor_for_custom_case_is_none():
    assert anchors.anchor_for("h7_fixed_99") is None
    assert anchors.anchor_for("h4_fixed_65536") == {"flash_kda_ms": 6.638, "fla_ms": 2.162, "floor_ms": 0.079}
