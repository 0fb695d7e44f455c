"""Benchmark cases: the standard 13-case suite and cases built from command-line flags.

A case is one forward call shape and its variant. Fixed length: `batch` sequences of `T`
tokens, tensors [batch, T, H, 128], no cu_seqlens. Varlen: `seqlens` packed into
[1, sum(seqlens), H, 128] with cu_seqlens = [0, cumsum(seqlens)]. K = V = 128 and HV = H
(FlashKDA's configuration). The variant: the gate (safe, softplus or pre-computed), the state
layout, the initial and final state dtypes, and whether q, k, v are views of one fused
projection (strided); and the entry point that runs it (fwd, or chunk_kda with fla's keyword
arguments).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: Sequence lengths of the "mixed_varlen" standard cases (sum 8192), from anchors-h200.md.
MIXED_SEQLENS = (1300, 547, 2048, 963, 271, 3063)

#: Bytes per element of the recurrent state for each --state choice ("none": no state at all).
STATE_BYTES = {"none": 0, "bf16": 2, "fp32": 4}

#: Default --state: the anchors were measured with fp32 initial and final states.
DEFAULT_STATE = "fp32"

#: --gate choices: the safe gate lower_bound * sigmoid(exp(A_log) (g + dt_bias)) (FlashKDA's);
#: the softplus gate -exp(A_log) softplus(g + dt_bias) (fla's KimiDeltaAttention default, the
#: released Kimi-Linear-48B); "pre": g is that softplus decay computed beforehand (fp32), passed
#: with use_gate_in_kernel=False.
GATES = ("safe", "softplus", "pre")
#: --state-layout choices: [N, HV, V, K] (FlashKDA, state_v_first=True) or [N, HV, K, V] (fla's default).
STATE_LAYOUTS = ("v_first", "k_first")
#: --entry choices: flash_kda.fwd writing preallocated outputs (FlashKDA's configuration only), or
#: flash_kda.chunk_kda with fla's keyword arguments, allocating its outputs (every variant).
ENTRIES = ("fwd", "chunk_kda")


def is_flashkda_configuration(gate: str, state_layout: str, state_dtypes: tuple | None, strided: bool) -> bool:
    """FlashKDA's own configuration, whichever entry point runs it: the safe gate, v-first
    states, one state dtype (state_dtypes None; else the (initial, final) pair), contiguous
    inputs (not strided)."""
    return gate == "safe" and state_layout == "v_first" and state_dtypes is None and not strided


@dataclass(frozen=True)
class Case:
    """One benchmark shape.

    Attributes:
        name: case label (standard names match anchors-h200.md rows).
        heads: H = HV (q/k heads = value heads).
        T: tokens per sequence for fixed-length cases (ignored when seqlens is given).
        batch: B, number of fixed-length sequences (1 for varlen).
        seqlens: varlen sequence lengths (packed with cu_seqlens), or None for fixed length.
        state: "none", "bf16" or "fp32": dtype of initial_state [N, H, V, K] (and of
            final_state unless state_out says otherwise).
        head_dim_k, head_dim_v: K and V (128 for every flash_kda kernel today).
        gate: one of GATES.
        state_layout: one of STATE_LAYOUTS.
        state_out: dtype of final_state ("bf16" or "fp32") when it differs from state's; None:
            the same.
        strided: q, k and v are views of one fused [B, T, 3, H, K] projection (token stride
            3 H K) instead of separate contiguous tensors.
        entry: one of ENTRIES, the flash_kda function timed: "fwd" takes FlashKDA's
            configuration only; "chunk_kda" takes every variant, and FlashKDA's configuration
            with --entry chunk_kda (so that a variant's A/B against it times one entry point).
    """

    name: str
    heads: int
    T: int = 0
    batch: int = 1
    seqlens: tuple[int, ...] | None = None
    state: str = DEFAULT_STATE
    head_dim_k: int = 128
    head_dim_v: int = 128
    gate: str = "safe"
    state_layout: str = "v_first"
    state_out: str | None = None
    strided: bool = False
    entry: str = "fwd"

    @property
    def final_state_dtype(self) -> str:
        """dtype of final_state: state_out, else state ("none": no state at all)."""
        return self.state if self.state == "none" or self.state_out is None else self.state_out

    @property
    def flashkda_configuration(self) -> bool:
        """True for FlashKDA's own configuration (safe gate, v-first, one state dtype,
        contiguous inputs), whichever entry point runs it."""
        dtypes = None if self.final_state_dtype == self.state else (self.state, self.final_state_dtype)
        return is_flashkda_configuration(self.gate, self.state_layout, dtypes, self.strided)

    @property
    def plain(self) -> bool:
        """True for FlashKDA's own configuration through flash_kda.fwd: the call of the anchors
        and of the README's table."""
        return self.flashkda_configuration and self.entry == "fwd"

    def variant_label(self) -> str:
        """The variant in words ("softplus gate, k-first, bf16 -> fp32 states, strided q/k/v";
        "safe gate, v-first states, fp32 states, through chunk_kda"), for section titles. The
        entry point is named only for FlashKDA's configuration: every other variant runs
        through chunk_kda."""
        parts = [f"{self.gate} gate", self.state_layout.replace("_", "-") + " states"]
        if self.state == "none":
            parts[-1] = "no state"
        elif self.final_state_dtype != self.state:
            parts.append(f"{self.state} -> {self.final_state_dtype} states")
        else:
            parts.append(f"{self.state} states")
        if self.strided:
            parts.append("strided q/k/v (views of a fused projection)")
        if self.flashkda_configuration and self.entry != "fwd":
            parts.append(f"through {self.entry}")
        return ", ".join(parts)

    @property
    def varlen(self) -> bool:
        """True when the case packs sequences with cu_seqlens."""
        return self.seqlens is not None

    @property
    def num_seqs(self) -> int:
        """N: number of sequences (and of initial/final states)."""
        return len(self.seqlens) if self.varlen else self.batch

    @property
    def total_tokens(self) -> int:
        """T_total: tokens over all sequences."""
        return sum(self.seqlens) if self.varlen else self.batch * self.T

    def cu_seqlens(self) -> list[int] | None:
        """[0, l0, l0+l1, ...] for varlen cases (N+1 entries), None for fixed length."""
        if not self.varlen:
            return None
        out = [0]
        for n in self.seqlens:
            out.append(out[-1] + n)
        return out

    def to_dict(self) -> dict:
        """JSON-ready description (adds T_total and num_seqs)."""
        d = asdict(self)
        d["seqlens"] = list(self.seqlens) if self.seqlens is not None else None
        d["T_total"] = self.total_tokens
        d["num_seqs"] = self.num_seqs
        return d


def hbm_floor_bytes(case: Case) -> int:
    """Fewest bytes one forward must move through HBM for `case`.

    Reads q, k (T_total*H*K bf16 each), v (T_total*HV*V bf16), g (T_total*HV*K: bf16, fp32 for
    the pre-computed gate), beta (T_total*HV bf16), A_log (HV fp32), dt_bias (HV*K fp32; neither
    for the pre-computed gate) and initial_state (N*HV*V*K); writes out (T_total*HV*V bf16) and
    final_state (N*HV*V*K). State bytes per element follow case.state and
    case.final_state_dtype (0 when "none"). cu_seqlens is negligible and not counted. This is
    the byte count anchors-h200.md divides by the copy bandwidth; strided views move the same
    bytes.
    """
    t, h, k, v = case.total_tokens, case.heads, case.head_dim_k, case.head_dim_v
    bf16, fp32 = 2, 4
    g_bytes = fp32 if case.gate == "pre" else bf16
    activations = t * h * (k + k + v + v) * bf16 + t * h * k * g_bytes  # q, k, v, g read; out written
    beta = t * h * bf16
    gate_params = 0 if case.gate == "pre" else h * fp32 + h * k * fp32  # A_log, dt_bias
    state_elems = case.num_seqs * h * v * k
    states = state_elems * (STATE_BYTES[case.state] + STATE_BYTES[case.final_state_dtype])  # read + written
    return activations + beta + gate_params + states


def floor_ms(case: Case, copy_bandwidth: float) -> float:
    """HBM floor in milliseconds: hbm_floor_bytes(case) / copy_bandwidth (bytes/s, read+write)."""
    return hbm_floor_bytes(case) / copy_bandwidth * 1e3


def standard_suite(state: str = DEFAULT_STATE) -> list[Case]:
    """The 13 cases of anchors-h200.md, in its order, with the given state dtype."""
    mixed = MIXED_SEQLENS
    return [
        Case("h96_fixed_8192", 96, T=8192, state=state),
        Case("h96_mixed_varlen", 96, seqlens=mixed, state=state),
        Case("h96_uniform_1024x8", 96, seqlens=(1024,) * 8, state=state),
        Case("h64_fixed_8192", 64, T=8192, state=state),
        Case("h64_mixed_varlen", 64, seqlens=mixed, state=state),
        Case("h64_uniform_1024x8", 64, seqlens=(1024,) * 8, state=state),
        Case("h32_fixed_8192", 32, T=8192, state=state),
        Case("h16_fixed_8192", 16, T=8192, state=state),
        Case("h8_fixed_32768", 8, T=32768, state=state),
        Case("h4_fixed_65536", 4, T=65536, state=state),
        Case("h4_fixed_1024", 4, T=1024, state=state),
        Case("h96_fixed_512", 96, T=512, state=state),
        Case("h32_batch16_2048", 32, T=2048, batch=16, state=state),
    ]


def custom_case(heads: int, T: int | None, batch: int, seqlens: list[int] | None, state: str) -> Case:
    """One case from --heads/--T/--batch/--seqlens; the name says its shape.

    Raises ValueError when neither T nor seqlens is given, or when --batch is combined with
    --seqlens (a varlen batch is one packed row).
    """
    if seqlens is not None:
        if batch != 1:
            raise ValueError("--batch cannot be combined with --seqlens (varlen packs one row)")
        if T is not None and T != sum(seqlens):
            raise ValueError(f"--T {T} disagrees with sum(--seqlens) = {sum(seqlens)}")
        return Case(f"h{heads}_varlen_{len(seqlens)}x{sum(seqlens)}", heads, seqlens=tuple(seqlens), state=state)
    if T is None:
        raise ValueError("a custom case needs --T or --seqlens")
    name = f"h{heads}_fixed_{T}" if batch == 1 else f"h{heads}_batch{batch}_{T}"
    return Case(name, heads, T=T, batch=batch, state=state)


def select_cases(names: list[str], state: str = DEFAULT_STATE) -> list[Case]:
    """Standard cases by name, in the order given. Raises ValueError naming unknown ones."""
    by_name = {c.name: c for c in standard_suite(state)}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    return [by_name[n] for n in names]
