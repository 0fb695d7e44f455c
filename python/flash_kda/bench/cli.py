"""Command line of `python -m flash_kda.bench`: flags, case selection, output paths."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from . import cases as cases_mod
from . import decode as decode_mod

#: File name of the record the repository keeps (written only with --write-record).
RECORD_NAME = "BENCHMARK_H200.md"
#: Its chart, written beside it.
RECORD_CHART = "BENCHMARK_H200.png"
#: The run's results.json, kept beside it (--from-json re-renders it).
RECORD_JSON = "BENCHMARK_H200.json"


def parse_seqlens(text: str) -> list[int]:
    """Parse "1300,547,2048" into [1300, 547, 2048].

    Every entry must be an integer >= 1 (a zero-length sequence has nothing to time) and at
    least one is needed. Raises argparse.ArgumentTypeError with the offending entry.
    """
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(p == "" for p in parts):
        raise argparse.ArgumentTypeError(f"--seqlens wants comma-separated lengths like 1300,547; got {text!r}")
    try:
        return [_positive_int(p) for p in parts]
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"--seqlens entry {err}") from None


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} must be >= 1")
    return n


def _int_list(text: str) -> list[int]:
    """Parse "1,8,32" into [1, 8, 32] (integers >= 1, at least one)."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(p == "" for p in parts):
        raise argparse.ArgumentTypeError(f"want comma-separated integers like 1,8,32; got {text!r}")
    return [_positive_int(p) for p in parts]


def _layout_list(text: str) -> list[str]:
    """Parse "v_first,k_first" into ["v_first", "k_first"] (state layouts of the decode sweep)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in decode_mod.LAYOUTS]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"want distinct state layouts among {', '.join(decode_mod.LAYOUTS)}; "
                                         f"got {text!r}")
    return names


def _state_list(text: str) -> list[str]:
    """Parse "fp32,bf16" into ["fp32", "bf16"] (pool dtypes of the decode sweep)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in decode_mod.STATE_BYTES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"want pool dtypes among {', '.join(decode_mod.STATE_BYTES)}; got {text!r}")
    return names


def _gate_list(text: str) -> list[str]:
    """Parse "safe,softplus" into ["safe", "softplus"] (cases.GATES, each at most once)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in cases_mod.GATES]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"want distinct gates among {', '.join(cases_mod.GATES)}; got {text!r}")
    return names


def _state_dtypes(text: str) -> tuple[str, str]:
    """Parse "bf16,fp32" into ("bf16", "fp32"): initial_state's dtype, then final_state's."""
    names = [n.strip() for n in text.split(",")]
    if len(names) != 2 or any(n not in ("bf16", "fp32") for n in names):
        raise argparse.ArgumentTypeError(f"want IN,OUT with each bf16 or fp32 (initial, final state); got {text!r}")
    return names[0], names[1]


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("--cases wants comma-separated case names")
    return names


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the benchmark CLI (see docs/benchmark.md for each flag)."""
    p = argparse.ArgumentParser(
        prog="python -m flash_kda.bench",
        description="Time flash_kda's KDA forward against flash-linear-attention's chunk_kda "
        "(Triton path) on an sm_90 GPU, check both against the fp64 reference, and report "
        "each time's multiple of the HBM floor.",
    )
    shape = p.add_argument_group("cases (default: the 13-case standard suite)")
    shape.add_argument("--cases", type=_names, metavar="NAME,...", help="standard cases by name")
    shape.add_argument("--T", type=_positive_int, help="tokens per sequence of one custom fixed-length case")
    shape.add_argument("--heads", type=_positive_int, default=None, help="heads H = HV of a custom case (default 96; not with --layer)")
    shape.add_argument("--seqlens", type=parse_seqlens, metavar="L1,L2,...", help="one custom varlen case")
    shape.add_argument("--batch", type=_positive_int, default=1, help="fixed-length sequences of a custom case")
    shape.add_argument("--state", choices=sorted(cases_mod.STATE_BYTES), default=cases_mod.DEFAULT_STATE,
                       help="initial/final state dtype (default fp32, as the anchors)")
    var = p.add_argument_group("variant of every forward case (default: FlashKDA's configuration)")
    var.add_argument("--gate", type=_gate_list, default=["safe"], metavar="GATE,...",
                     help="gates, each running every selected case: safe (lower_bound * sigmoid, FlashKDA's), "
                     "softplus (-exp(A_log) softplus(g + dt_bias): fla's default, Kimi-Linear-48B), pre (that "
                     "decay computed beforehand, use_gate_in_kernel=False) (default safe)")
    var.add_argument("--state-layout", choices=cases_mod.STATE_LAYOUTS, default="v_first",
                     help="state layout: v_first [N, H, V, K] (FlashKDA) or k_first [N, H, K, V] (fla's default)")
    var.add_argument("--state-dtypes", type=_state_dtypes, default=None, metavar="IN,OUT",
                     help="initial and final state dtypes, e.g. bf16,fp32 (instead of --state)")
    var.add_argument("--strided", action="store_true",
                     help="q, k, v as views of one fused [B, T, 3, H, K] projection (token stride 3 H K)")
    var.add_argument("--entry", choices=cases_mod.ENTRIES, default=None,
                     help="flash_kda function timed: fwd (preallocated outputs; FlashKDA's configuration only) or "
                     "chunk_kda (fla's keyword arguments, outputs allocated per call); default fwd for FlashKDA's "
                     "configuration, chunk_kda for every other variant")
    dec = p.add_argument_group("decode (--decode: the decode step over a state pool against fla's fused_recurrent_kda_fwd)")
    dec.add_argument("--decode", action="store_true",
                     help="run the decode sweep instead of the forward cases (default: every point of the sweep "
                     "below; each --decode-* flag narrows it)")
    dec.add_argument("--decode-seqs", type=_int_list, metavar="N,...", default=None,
                     help="sequences per call (default " + ",".join(map(str, decode_mod.NUM_SEQS)) + ")")
    dec.add_argument("--decode-heads", type=_int_list, metavar="H,...", default=None,
                     help="heads H = HV (default " + ",".join(map(str, decode_mod.HEADS)) + ")")
    dec.add_argument("--decode-tokens", type=_int_list, metavar="T,...", default=None,
                     help="tokens per sequence, 1..16 (default " + ",".join(map(str, decode_mod.TOKENS)) + ")")
    dec.add_argument("--decode-states", type=_state_list, metavar="DTYPE,...", default=None,
                     help="pool dtypes (default " + ",".join(decode_mod.STATES) + ")")
    dec.add_argument("--decode-layouts", type=_layout_list, metavar="LAYOUT,...", default=None,
                     help="state layouts: v_first ([P, HV, V, K]), k_first ([P, HV, K, V], fla's default); "
                     "default v_first")
    dec.add_argument("--decode-kernel", dest="decode_kernel", metavar="KERNEL,...", default=None,
                     help="decode kernels to time, each as its own implementation on the same inputs: auto "
                     "(the plan's choice, reported as flash_kda), persistent, direct, direct_columns "
                     "(k-first pools in the direct kernel's warp-column form), direct_rows (every "
                     "k-first pool in its row blocks); reported as flash_kda_persistent, "
                     "flash_kda_direct, flash_kda_direct_columns, flash_kda_direct_rows; default auto")
    dec.add_argument("--check-seqs", type=_positive_int, default=decode_mod.DEFAULT_SAMPLE, metavar="S",
                     help=f"sequences of each decode point checked against the fp64 reference (default "
                     f"{decode_mod.DEFAULT_SAMPLE}; all when fewer)")
    trn = p.add_argument_group("training (--train: forward + backward against fla's chunk_kda)")
    trn.add_argument("--train", action="store_true",
                     help="time one training step (forward + backward) of flash_kda.chunk_kda and fla's chunk_kda "
                     "(Triton) per selected case (default the standard suite), measure the bytes each saves for "
                     "its backward, and check the gradients on a slice against the fp64 autograd reference; "
                     "eager timings only")
    run = p.add_argument_group("measurement")
    run.add_argument("--iters", type=_positive_int, default=100, help="timed calls per implementation and mode (default 100)")
    run.add_argument("--warmup", type=_positive_int, default=10, help="untimed calls before timing (default 10)")
    run.add_argument("--seed", type=int, default=0, help="torch RNG seed for the inputs")
    run.add_argument("--no-fla", action="store_true", help="skip flash-linear-attention even if installed")
    run.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    run.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph timings")
    run.add_argument("--num-sms", type=_positive_int, default=None, metavar="N",
                     help="run every call on a CUDA green context of N SMs (a multiple of 8; e.g. 80 or 112 "
                     "for an H20 or H100 PCIe) and give flash_kda's plan the same count; eager timings only")
    run.add_argument("--kernels", action="store_true",
                     help="after every case is timed, also record each case's per-kernel device time "
                     "(torch.profiler over 20 eager calls of flash_kda, or with --train 20 forward + backward "
                     "steps: mean us a call of each kernel; results.json kernels_us, a table in results.md); "
                     "for telling which kernel an A/B moves; not with --write-record")
    run.add_argument("--layer", action="store_true",
                     help="time fla's KimiDeltaAttention layer (hidden 2304, 32 heads) Triton vs flash_kda instead")
    out = p.add_argument_group("output")
    out.add_argument("--out-dir", type=Path, default=Path("bench-out"),
                     help="folder for results.json, results.md and chart.png (default ./bench-out)")
    out.add_argument("--markdown", type=Path, default=None, help="also write the Markdown report to PATH")
    out.add_argument("--write-record", action="store_true",
                     help=f"also write {RECORD_NAME}, {RECORD_CHART} and {RECORD_JSON} (the committed record) at the "
                     "root of the checkout flash_kda runs from (an editable install), else in the current folder")
    out.add_argument("--no-plot", action="store_true", help="do not draw chart.png")
    out.add_argument("--from-json", type=Path, default=None, metavar="RESULTS_JSON",
                     help="run nothing: re-render the outputs (table, Markdown, chart, --write-record) "
                     "of an earlier run from its results.json; needs no GPU")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse argv and check flag combinations; argparse exits with code 2 on bad input.

    Adds `cases` (list[Case]) to the namespace, replacing the raw --cases names.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    decode_flags = [f for f in ("decode_seqs", "decode_heads", "decode_tokens", "decode_states", "decode_layouts",
                                "decode_kernel") if getattr(args, f) is not None]
    args.decode_cases = []
    variant = (args.gate != ["safe"] or args.state_layout != "v_first" or args.state_dtypes is not None or args.strided
               or args.entry is not None)
    if args.kernels and (args.decode or args.layer or args.from_json is not None or args.write_record):
        parser.error("--kernels profiles the forward cases (or --train's steps) after their timings: not with "
                     "--decode, --layer, --from-json or --write-record (a record's timings come from a run without "
                     "the profiler)")
    if args.decode and variant:
        parser.error("--gate/--state-layout/--state-dtypes/--strided/--entry vary the forward cases: not with --decode")
    if args.train:
        if args.decode or args.layer or args.num_sms is not None or args.from_json is not None:
            parser.error("--train runs training steps of the forward cases: not with --decode, --layer, --num-sms "
                         "or --from-json (re-render a training run with --from-json alone)")
        if args.strided or args.entry is not None or args.state_dtypes is not None or args.state == "bf16":
            parser.error("--train runs flash_kda.chunk_kda and fla's chunk_kda on contiguous inputs with fp32 "
                         "states (fla's rule): not with --strided, --entry, --state-dtypes or --state bf16")
    if not args.decode and decode_flags:
        parser.error(f"--{decode_flags[0].replace('_', '-')} narrows the decode sweep: give --decode too")
    if args.decode:
        if args.layer or args.cases is not None or args.T is not None or args.seqlens is not None \
                or args.heads is not None or args.batch != 1:
            parser.error("--decode runs the decode sweep: do not combine it with forward case flags or --layer")
        if args.num_sms is not None or args.from_json is not None:
            parser.error("--decode does not take --num-sms or --from-json (re-render a decode run with --from-json alone)")
        try:
            args.decode_cases = decode_mod.decode_cases(
                args.decode_seqs or decode_mod.NUM_SEQS, args.decode_heads or decode_mod.HEADS,
                args.decode_tokens or decode_mod.TOKENS, args.decode_states or decode_mod.STATES,
                args.decode_layouts or decode_mod.DEFAULT_LAYOUTS)
        except ValueError as e:
            parser.error(str(e))
        try:
            args.decode_kernels = (decode_mod.parse_kernels(args.decode_kernel) if args.decode_kernel is not None
                                   else list(decode_mod.DEFAULT_KERNELS))
        except ValueError as e:
            parser.error(str(e))
        args.cases = []
        return args
    custom = args.T is not None or args.seqlens is not None
    if args.cases is not None and custom:
        parser.error("--cases selects standard cases; do not combine it with --T/--seqlens")
    if not custom and (args.heads is not None or args.batch != 1):
        if not args.layer:
            parser.error("--heads/--batch describe a custom case: give --T or --seqlens too")
    if args.layer and args.heads is not None:
        parser.error("--heads does not apply to --layer (the layer has Kimi Linear's 32 heads)")
    if args.from_json is not None and (custom or args.cases is not None or args.layer):
        parser.error("--from-json re-renders an earlier run: do not combine it with case flags or --layer")
    if args.num_sms is not None and args.layer:
        parser.error("--num-sms applies to the kernel benchmark, not to --layer")
    if args.num_sms is not None:
        args.no_graph = True  # time_graph's warm-up and capture streams are made outside the partition
    if args.layer and args.T is not None and args.T <= 64:
        parser.error("--layer needs --T > 64 (fla runs its fused_recurrent path for T <= 64)")
    if variant and (args.layer or args.from_json is not None):
        parser.error("--gate/--state-layout/--state-dtypes/--strided/--entry vary the forward cases: "
                     "not with --layer or --from-json")
    if args.state_dtypes is not None and args.state != cases_mod.DEFAULT_STATE:
        parser.error("give either --state or --state-dtypes")
    state, state_out = args.state_dtypes if args.state_dtypes is not None else (args.state, None)
    try:
        if custom:
            heads = args.heads if args.heads is not None else 96
            base = [cases_mod.custom_case(heads, args.T, args.batch, args.seqlens, state)]
        elif args.cases is not None:
            base = cases_mod.select_cases(args.cases, state)
        else:
            base = cases_mod.standard_suite(state)
    except ValueError as e:
        parser.error(str(e))
    cases = [dataclasses.replace(c, gate=gate, state_layout=args.state_layout,
                                 state_out=state_out if state_out != state else None, strided=args.strided)
             for gate in args.gate for c in base]
    if args.entry == "fwd" and not all(c.flashkda_configuration for c in cases):
        parser.error("--entry fwd takes FlashKDA's configuration only (safe gate, v-first, one state dtype, "
                     "contiguous inputs): the other variants run through flash_kda.chunk_kda")
    out_dtype = state_out or state
    if out_dtype == "bf16" and (args.gate != ["safe"] or args.state_layout != "v_first" or args.strided
                                or (state_out is not None and state_out != state) or args.entry == "chunk_kda"):
        parser.error("a bf16 final state is FlashKDA's configuration through fwd only (the other variants and "
                     "--entry chunk_kda run flash_kda.chunk_kda, whose final state is fp32 as fla's): use "
                     "--state fp32 or --state-dtypes bf16,fp32")
    args.cases = [dataclasses.replace(c, entry="chunk_kda" if args.train else
                                      args.entry or ("fwd" if c.flashkda_configuration else "chunk_kda"))
                  for c in cases]
    return args


def repo_root(start: Path | None = None) -> Path:
    """The flash-kda checkout this module lives in, or the current folder when installed.

    A checkout is recognised by include/flash_kda/forward.h two levels above the package.
    """
    here = (start or Path(__file__)).resolve()
    for parent in here.parents:
        if (parent / "include" / "flash_kda" / "forward.h").is_file():
            return parent
    return Path.cwd()
