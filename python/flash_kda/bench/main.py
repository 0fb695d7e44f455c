"""Top level of the benchmark: parse flags, check the machine, run, write every output."""

from __future__ import annotations

import sys

from . import cli, environment, report

#: Exit codes: 0 all ran and every check passed, 1 a check failed or a run errored (with
#: --layer: the layer's outputs differ by more than layer.REL_DIFF_BOUND or it did not dispatch),
#: 2 bad flags (argparse) or a machine that cannot run the benchmark.
EXIT_OK, EXIT_FAILED, EXIT_UNSUPPORTED = 0, 1, 2


def main(argv: list[str] | None = None) -> int:
    """Run `python -m flash_kda.bench` with argv (default sys.argv[1:]); returns the exit code.

    On a machine without an sm_90 GPU, CUDA torch and a CUDA build of flash_kda, prints one
    sentence on stderr and returns 2 before touching the GPU.
    """
    args = cli.parse_args(argv)
    if args.from_json is not None:
        return rerender(args)
    unmet = environment.unmet_requirement()
    if unmet is not None:
        print(unmet, file=sys.stderr)
        return EXIT_UNSUPPORTED
    from . import suite

    meta = environment.collect_meta()
    if not environment.fla_available():
        meta["fla"] = "not installed"
    if args.decode:
        from . import decode

        results = decode.run_decode_suite(args, meta, on_point=lambda partial: write_partial(partial, args))
        failed = any(decode.point_failed(r) for r in results["decode"])
    elif args.train:
        from . import train

        results = train.run_train_suite(args, meta, on_case=lambda partial: write_partial(partial, args))
        failed = any(train.case_failed(r) for r in results["train"])
    elif args.layer:
        unmet = environment.fla_layer_unavailable()
        if unmet is not None:
            print(unmet, file=sys.stderr)
            return EXIT_UNSUPPORTED
        from . import layer

        suite.progress("running the KimiDeltaAttention layer, Triton then flash_kda")
        T = args.T if args.T is not None else 8192
        results = {"meta": meta, "cases": [], "layer": layer.run_layer(T, args.batch, args.warmup, args.iters, args.seed)}
        failed = not layer.layer_passed(results["layer"])
    else:
        results = suite.run_suite(args, meta, on_case=lambda partial: write_partial(partial, args))
        failed = any(case_failed(r) for r in results["cases"])
    write_outputs(results, args)
    print(report.format_table(results))
    return EXIT_FAILED if failed else EXIT_OK


def rerender(args) -> int:
    """--from-json: the outputs of an earlier run, re-rendered from its results.json (for a
    run whose files did not all come back, or after a change to the report format). The data
    and its metadata (GPU, versions, date) are the earlier run's; nothing is measured."""
    import json

    try:
        results = json.loads(args.from_json.read_text())
        if not isinstance(results, dict) or not isinstance(results.get("cases"), list):
            raise ValueError("no 'cases' list")
    except (OSError, ValueError) as err:
        print(f"--from-json: cannot read {args.from_json}: {err}", file=sys.stderr)
        return EXIT_UNSUPPORTED
    import datetime

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results.setdefault("meta", {})["rendered"] = f"re-rendered from {args.from_json.name} with --from-json on {now}"
    write_outputs(results, args)
    print(report.format_table(results))
    from . import decode, train

    failed = (any(case_failed(r) for r in results["cases"])
              or any(decode.point_failed(r) for r in results.get("decode", []))
              or any(train.case_failed(r) for r in results.get("train", [])))
    return EXIT_FAILED if failed else EXIT_OK


def case_failed(r: dict) -> bool:
    """A case fails when its check failed or errored, or flash_kda's own timing raised.
    fla's errors (e.g. a capture its Triton path does not support) are reported, not failures."""
    if r.get("check") is not None and not r["check"]["passed"]:
        return True
    return any(what == "check" or what.startswith("flash_kda") for what in r.get("errors", {}))


def write_partial(results: dict, args) -> None:
    """results.json and results.md in --out-dir with the cases finished so far (called after
    each case, so that a run stopped by a time limit leaves them; the chart, --markdown and
    --write-record come only with the whole run, from write_outputs)."""
    out = args.out_dir
    report.write_json(results, out / "results.json")
    report.write_markdown(results, out / "results.md")


def write_outputs(results: dict, args) -> None:
    """results.json, results.md and (unless --no-plot or no cases) chart.png in --out-dir;
    the Markdown at --markdown PATH (linking that chart); with --write-record,
    BENCHMARK_H200.md, .png and .json at the root of the checkout flash_kda runs from (an
    editable install), else in the current folder (cli.repo_root), and the benchmark table of
    the README.md there (report.update_readme)."""
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json", out / "results.md"]
    draw = bool(results["cases"]) and not args.no_plot

    def chart_at(path):
        if not draw:
            return None
        try:
            from . import plotting

            plotting.plot(results, path)
        except ImportError:
            print("[flash_kda.bench] matplotlib is not installed: no chart (pip install matplotlib)",
                  file=sys.stderr)
            return None
        written.append(path)
        return path

    chart = chart_at(out / "chart.png")
    report.write_json(results, out / "results.json")
    report.write_markdown(results, out / "results.md", "chart.png" if chart else None)
    if args.markdown is not None:
        link = None
        if chart:
            try:
                link = str(chart.resolve().relative_to(args.markdown.resolve().parent))
            except ValueError:
                link = str(chart.resolve())
        report.write_markdown(results, args.markdown, link)
        written.append(args.markdown)
    if args.write_record and results.get("decode") and not results.get("cases"):
        write_decode_record(results, cli.repo_root(), written)
    elif args.write_record and results.get("train") and not results.get("cases"):
        write_train_record(results, cli.repo_root(), written)
    elif args.write_record:
        root = cli.repo_root()
        results = keep_record_decode(results, root / cli.RECORD_JSON)
        results = keep_record_train(results, root / cli.RECORD_JSON)
        record_chart = chart_at(root / cli.RECORD_CHART)
        report.write_markdown(results, root / cli.RECORD_NAME, cli.RECORD_CHART if record_chart else None)
        report.write_json(results, root / cli.RECORD_JSON)
        written += [root / cli.RECORD_NAME, root / cli.RECORD_JSON]
        if report.update_readme(root / "README.md", results):
            written.append(root / "README.md")
    print("[flash_kda.bench] wrote " + ", ".join(str(p) for p in written), file=sys.stderr)


def keep_record_decode(results: dict, path) -> dict:
    """A forward run's results with the decode table of the record at `path` (its `decode`
    list and `decode_run`), so that a forward --write-record replaces the forward sections
    and keeps the decode one. A missing or unreadable record, or a run that has its own
    decode points, gives the results unchanged."""
    return _keep_record_section(results, path, "decode", report.DECODE_RUN_KEYS, report.merge_decode)


def keep_record_train(results: dict, path) -> dict:
    """A forward run's results with the training table of the record at `path` (its `train`
    list and `train_run`), so that a forward --write-record keeps it. A missing or unreadable
    record, or a run that has its own training cases, gives the results unchanged."""
    return _keep_record_section(results, path, "train", report.TRAIN_RUN_KEYS, report.merge_train)


def _keep_record_section(results: dict, path, key: str, run_keys: tuple, merge) -> dict:
    """The results merged (merge) with the `key` list of the record at `path` and its run's
    metadata (`{key}_run`, or the run_keys at the record's top level); the results unchanged
    when they have their own `key` list or the record is missing, unreadable or without one."""
    import json

    if results.get(key):
        return results
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return results
    if not isinstance(record, dict) or not record.get(key):
        return results
    # A record of this section alone has its run's metadata at the top level.
    run = record.get(f"{key}_run") or {k: record[k] for k in run_keys if k in record}
    return merge(results, {key: record[key], **run})


def write_train_record(results: dict, root, written: list) -> None:
    """--train --write-record: the training cases become the `train` list of the record's
    BENCHMARK_H200.json (its forward `cases`, decode table, meta and chart are kept) and the
    training section of BENCHMARK_H200.md, re-rendered from the merged record."""
    _write_section_record(results, root, written, "training", report.merge_train)


def write_decode_record(results: dict, root, written: list) -> None:
    """--decode --write-record: the decode points become the `decode` list of the record's
    BENCHMARK_H200.json (its forward `cases`, meta and chart are kept) and the decode
    section of BENCHMARK_H200.md, re-rendered from the merged record."""
    _write_section_record(results, root, written, "decode", report.merge_decode)


def _write_section_record(results: dict, root, written: list, section: str, merge) -> None:
    """A run of one section (`section` names its table in the message): the record's
    BENCHMARK_H200.json with merge(record, results), and BENCHMARK_H200.md re-rendered from it
    (with the record's chart when it has one and forward cases). An unreadable record is
    replaced by one holding this section alone."""
    import json

    path = root / cli.RECORD_JSON
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        print(f"[flash_kda.bench] {path} unreadable ({err}): the record gets the {section} table alone", file=sys.stderr)
        record = {"meta": results.get("meta", {}), "cases": []}
    merged = merge(record, results)
    chart = cli.RECORD_CHART if (root / cli.RECORD_CHART).is_file() and merged.get("cases") else None
    report.write_markdown(merged, root / cli.RECORD_NAME, chart)
    report.write_json(merged, path)
    written += [root / cli.RECORD_NAME, path]
