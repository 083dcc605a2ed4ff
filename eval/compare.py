"""Paired comparison of lm-evaluation-harness runs: accuracy per arm, per-question agreement, exact McNemar tests.

Each run is what ``hf-replayssm lm-eval run ... --output_path OUT --log_samples`` writes (lm-eval 0.4.x layout):
``OUT/<model name>/results_<date>.json`` next to one ``samples_<task>_<date>.jsonl`` per task (or, for an
``--output_path`` ending in ``.json``, ``<stem>_<date>.json`` with the samples files beside it). A run is given as that
results file or as a folder holding exactly one results file (searched recursively). Every samples line is one
document under one filter and carries that document's metric values (``acc``/``acc_norm`` for multiple choice,
``exact_match`` per filter for generation), its ``doc_id`` and its ``doc_hash``.

For one task and one per-question 0/1 metric the report gives, per arm, the accuracy with its standard error (lm-eval's
own formula: sample standard deviation / sqrt(n), i.e. sqrt(p(1-p)/(n-1)) for 0/1 values) and n; for every pair of
arms, the questions both answered (matched on ``doc_id`` and ``doc_hash``), the fraction on which they agree (both
right or both wrong) and an exact two-sided McNemar test: with b questions only the first arm of the pair got right
and c only the second, p = min(1, 2 * sum_{k <= min(b, c)} C(b + c, k) / 2^(b + c)). The Markdown table compares every
arm against the first one.

Command line (``hf-replayssm eval compare ...`` or ``python -m hf_replayssm.eval.compare ...``)::

    hf-replayssm eval compare results/fp32 results/shared-nvfp4 --task gpqa_diamond_zeroshot_local --out report.md

Arms are named by the ``model_args`` entries that differ between runs (e.g. ``precision=shared-nvfp4``) unless
``--names`` gives names. ``--metric`` takes a metric (``acc``, ``acc_norm``, ``exact_match``) or ``metric,filter``
(``exact_match,flexible-extract``); by default ``acc`` (or else ``exact_match``) under filter ``none`` (or else the
first filter the run reports).

Python: ``compare_runs(paths, task=None, metric=None) -> dict`` (see its docstring for the keys).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from itertools import combinations
from pathlib import Path

__all__ = ["compare_runs", "load_run", "main", "mcnemar_exact", "mean_stderr", "to_markdown"]

_PREFERRED_METRICS = ("acc", "exact_match")


# ---------------------------------------------------------------------- statistics
def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for ``b`` and ``c`` discordant pairs: the binomial(b + c, 1/2) test,
    ``min(1, 2 * P[X <= min(b, c)])``; 1.0 when there are no discordant pairs."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got {b}, {c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2**n)


def mean_stderr(values: list[float]) -> float | None:
    """lm-eval's standard error of a mean: sample standard deviation (n - 1) / sqrt(n); None for fewer than 2."""
    n = len(values)
    if n < 2:
        return None
    mu = sum(values) / n
    return math.sqrt(sum((x - mu) ** 2 for x in values) / (n - 1)) / math.sqrt(n)


# ---------------------------------------------------------------------- loading
def _date_id(results_file: Path) -> str:
    # lm-eval names files <prefix>_<datetime.isoformat() with ':' -> '-'>; the date itself has no '_'
    return results_file.stem.rsplit("_", 1)[-1]


def _find_results_file(path: Path) -> Path:
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"no such run: {path}")
    found = sorted(path.rglob("results_*.json"))
    if not found:  # an --output_path ending in .json: <stem>_<date>.json next to samples_<task>_<date>.jsonl
        found = sorted(f for f in path.rglob("*.json") if any(f.parent.glob(f"samples_*_{_date_id(f)}.jsonl")))
    if not found:
        raise FileNotFoundError(f"{path}: no results_*.json below it (an lm-eval --output_path folder?)")
    if len(found) > 1:
        listing = "\n  ".join(str(f) for f in found)
        raise ValueError(f"{path} holds {len(found)} results files; pass one of them:\n  {listing}")
    return found[0]


def _samples_files(results_file: Path) -> dict[str, Path]:
    """{task: samples file} written by the same lm-eval run as ``results_file`` (same date id, same folder); a log
    compressed with gzip (``.jsonl.gz``, how runs are kept in a repository) counts as well."""
    date_id = _date_id(results_file)
    found = {}
    for suffix in (f"_{date_id}.jsonl.gz", f"_{date_id}.jsonl"):  # the plain log wins where both exist
        for f in sorted(results_file.parent.glob(f"samples_*{suffix}")):
            found[f.name[len("samples_"):-len(suffix)]] = f
    return found


def _model_args(config: dict) -> dict:
    args = config.get("model_args") or {}
    if isinstance(args, dict):
        return dict(args)
    out = {}
    for part in str(args).split(","):
        if part.strip():
            key, _, value = part.partition("=")
            out[key.strip()] = value.strip()
    return out


def load_run(path: str | Path) -> dict:
    """One lm-eval run: ``{"path", "results_file", "results" (the parsed JSON), "model_args", "samples_files"}``."""
    path = Path(path)
    results_file = _find_results_file(path)
    try:
        results = json.loads(results_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{results_file}: not a JSON file ({error})") from None
    if not isinstance(results, dict) or "results" not in results:
        raise ValueError(f"{results_file}: not an lm-eval results file (no 'results' key)")
    return {
        "path": str(path),
        "results_file": str(results_file),
        "results": results,
        "model_args": _model_args(results.get("config") or {}),
        "samples_files": {task: str(f) for task, f in _samples_files(results_file).items()},
    }


def _read_samples(samples_file: str, metric: str, filter_key: str) -> dict[tuple[int, str], float]:
    """{(doc_id, doc_hash): metric value} for the lines of ``samples_file`` under ``filter_key``."""
    values: dict[tuple[int, str], float] = {}
    seen_filters: set[str] = set()
    opener = gzip.open if str(samples_file).endswith(".gz") else open
    with opener(samples_file, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            sample = json.loads(line)
            seen_filters.add(str(sample.get("filter", "none")))
            if str(sample.get("filter", "none")) != filter_key:
                continue
            if metric not in sample:
                raise ValueError(f"{samples_file}:{number}: no per-sample value for metric {metric!r} "
                                 f"(it has {sample.get('metrics')})")
            value = sample[metric]
            if isinstance(value, bool):
                value = float(value)
            if not isinstance(value, (int, float)) or value not in (0, 1):
                raise ValueError(f"{samples_file}:{number}: {metric}={value!r} is not a per-question 0/1 value; "
                                 "compare needs a right/wrong metric (acc, acc_norm, exact_match)")
            key = (int(sample["doc_id"]), str(sample.get("doc_hash", "")))
            if key in values:
                raise ValueError(f"{samples_file}:{number}: doc_id {key[0]} appears twice under filter {filter_key!r}")
            values[key] = float(value)
    if not values:
        raise ValueError(f"{samples_file}: no samples under filter {filter_key!r} (filters: {sorted(seen_filters)})")
    return values


# ---------------------------------------------------------------------- choices
def _pick_task(runs: list[dict], task: str | None) -> str:
    common = set(runs[0]["samples_files"])
    for run in runs[1:]:
        common &= set(run["samples_files"])
    if task is not None:
        for run in runs:
            if task not in run["samples_files"]:
                have = sorted(run["results"].get("results", {}))
                raise ValueError(f"{run['results_file']}: no samples file for task {task!r} (results for {have}; "
                                 "was the run made with --log_samples?)")
        return task
    if not common:
        raise ValueError("the runs have no task with logged samples in common (were they made with --log_samples?)")
    if len(common) > 1:
        raise ValueError(f"the runs share several tasks, choose one with --task: {', '.join(sorted(common))}")
    return next(iter(common))


def _metric_keys(run: dict, task: str) -> list[tuple[str, str]]:
    """[(metric, filter)] the run reports for ``task``, in its order."""
    keys = []
    for key in run["results"].get("results", {}).get(task, {}):
        name, sep, filter_key = key.partition(",")
        if sep and not name.endswith("_stderr"):
            keys.append((name, filter_key))
    return keys


def _pick_metric(runs: list[dict], task: str, metric: str | None) -> tuple[str, str]:
    reported = _metric_keys(runs[0], task)
    name, _, filter_key = (metric or "").partition(",")
    name, filter_key = name.strip(), filter_key.strip()
    if not name:
        names = [m for m, _ in reported]
        name = next((m for m in _PREFERRED_METRICS if m in names), names[0] if names else "")
        if not name:
            raise ValueError(f"{runs[0]['results_file']}: no metrics reported for task {task!r}; give --metric")
    if not filter_key:
        filters = [f for m, f in reported if m == name]
        filter_key = "none" if "none" in filters or not filters else filters[0]
    return name, filter_key


def _arm_names(runs: list[dict], names: list[str] | None) -> list[str]:
    if names is not None:
        if len(names) != len(runs):
            raise ValueError(f"{len(names)} names for {len(runs)} runs")
        out = [str(n) for n in names]
    else:
        keys: list[str] = []
        for run in runs:
            keys += [k for k in run["model_args"] if k not in keys]
        differing = [k for k in keys if len({json.dumps(r["model_args"].get(k), default=str) for r in runs}) > 1]
        out = []
        for run in runs:
            label = ",".join(f"{k}={run['model_args'][k]}" for k in differing if k in run["model_args"])
            out.append(label or Path(run["path"]).name or run["path"])
    seen: dict[str, int] = {}
    unique = []
    for name in out:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name} ({seen[name]})")
    return unique


# ---------------------------------------------------------------------- comparison
def compare_runs(paths, task: str | None = None, metric: str | None = None, names: list[str] | None = None) -> dict:
    """Compare lm-eval runs (results files or output folders, written with ``--log_samples``) on one task.

    ``task``: the task name (default: the one task all runs logged samples for). ``metric``: ``acc``, ``acc_norm``,
    ``exact_match``, ... or ``metric,filter`` (default ``acc``, else ``exact_match``; filter ``none`` else the first
    reported). ``names``: arm names (default: the ``model_args`` entries that differ between runs).

    Returns ``{"task", "metric", "filter", "arms", "pairs", "markdown"}``:

    * ``arms``: per run, in the given order: ``name``, ``path``, ``results_file``, ``samples_file``, ``model_args``,
      ``n``, ``correct``, ``accuracy``, ``stderr`` (None for n < 2), and the run's own ``reported`` value and
      ``reported_stderr`` for that metric (None when absent);
    * ``pairs``: per pair of arms (i < j; those with ``a`` the first arm come first): ``a``, ``b`` (names), ``n``
      (questions both answered), ``agree`` and ``agreement`` (count and fraction where both are right or both wrong),
      ``both_correct``, ``both_wrong``, ``only_a`` and ``only_b`` (discordant counts: only a / only b right),
      ``delta`` (accuracy of b minus that of a on those questions), ``p_value`` (exact McNemar), ``unmatched_a``
      and ``unmatched_b`` (questions only in a / only in b);
    * ``markdown``: the report (see ``to_markdown``)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if len(paths) < 2:
        raise ValueError(f"compare needs at least two runs, got {len(paths)}")
    runs = [load_run(p) for p in paths]
    task = _pick_task(runs, task)
    metric_name, filter_key = _pick_metric(runs, task, metric)
    arm_names = _arm_names(runs, names)

    arms, values = [], []
    for run, name in zip(runs, arm_names, strict=True):
        samples_file = run["samples_files"][task]
        per_doc = _read_samples(samples_file, metric_name, filter_key)
        scores = list(per_doc.values())
        task_results = run["results"].get("results", {}).get(task, {})
        reported = task_results.get(f"{metric_name},{filter_key}")
        reported_se = task_results.get(f"{metric_name}_stderr,{filter_key}")
        arms.append({
            "name": name,
            "path": run["path"],
            "results_file": run["results_file"],
            "samples_file": samples_file,
            "model_args": run["model_args"],
            "n": len(scores),
            "correct": int(sum(scores)),
            "accuracy": sum(scores) / len(scores),
            "stderr": mean_stderr(scores),
            "reported": reported if isinstance(reported, (int, float)) else None,
            "reported_stderr": reported_se if isinstance(reported_se, (int, float)) else None,
        })
        values.append(per_doc)

    pairs = []
    for i, j in combinations(range(len(arms)), 2):
        first, second = values[i], values[j]
        shared = [key for key in first if key in second]
        if not shared:
            raise ValueError(f"{arms[i]['name']} and {arms[j]['name']} have no question in common "
                             "(matched on doc_id and doc_hash: were they run on the same data?)")
        both = sum(1 for k in shared if first[k] and second[k])
        neither = sum(1 for k in shared if not first[k] and not second[k])
        only_a = sum(1 for k in shared if first[k] and not second[k])
        only_b = sum(1 for k in shared if second[k] and not first[k])
        pairs.append({
            "a": arms[i]["name"],
            "b": arms[j]["name"],
            "n": len(shared),
            "agree": both + neither,
            "agreement": (both + neither) / len(shared),
            "both_correct": both,
            "both_wrong": neither,
            "only_a": only_a,
            "only_b": only_b,
            "delta": (only_b - only_a) / len(shared),
            "p_value": mcnemar_exact(only_a, only_b),
            "unmatched_a": len(first) - len(shared),
            "unmatched_b": len(second) - len(shared),
        })
    report = {"task": task, "metric": metric_name, "filter": filter_key, "arms": arms, "pairs": pairs}
    report["markdown"] = to_markdown(report)
    return report


# ---------------------------------------------------------------------- report
def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def _num(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _p(value: float) -> str:
    return f"{value:.3f}" if value >= 1e-3 else f"{value:.1e}"


def to_markdown(report: dict) -> str:
    """The comparison as Markdown: a header line, one table row per arm (accuracy ± SE, n, then against the first
    arm: paired n, accuracy difference, agreement, discordant counts, McNemar p) and, for more than two arms, a
    pairwise agreement table."""
    arms, pairs = report["arms"], report["pairs"]
    base = arms[0]["name"]
    metric = report["metric"]
    lines = [
        f"**{_cell(report['task'])}**: `{metric}` (filter `{report['filter']}`), paired against "
        f"`{_cell(base)}`; McNemar p is exact and two-sided.",
        "",
        f"| arm | {metric} | ± SE | n | paired n | Δ vs {_cell(base)} | agreement | discordant (+/−) | McNemar p |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_pair = {(p["a"], p["b"]): p for p in pairs}
    for arm in arms:
        row = [f"`{_cell(arm['name'])}`", _num(arm["accuracy"]), _num(arm["stderr"]), str(arm["n"])]
        pair = by_pair.get((base, arm["name"]))
        if pair is None:
            row += ["—"] * 5
        else:
            row += [str(pair["n"]), f"{pair['delta']:+.4f}", _num(pair["agreement"]),
                    f"{pair['only_b']}/{pair['only_a']}", _p(pair["p_value"])]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(f"Discordant (+/−): questions only this arm / only `{_cell(base)}` got right. "
                 "SE: sample standard deviation / √n, as lm-eval reports it.")
    if len(arms) > 2:
        names = [a["name"] for a in arms]
        lines += ["", "Per-question agreement (McNemar p) between every pair of arms:", "",
                  "| | " + " | ".join(f"`{_cell(n)}`" for n in names) + " |",
                  "|---|" + "---:|" * len(names)]
        for a in names:
            row = []
            for b in names:
                pair = by_pair.get((a, b)) or by_pair.get((b, a))
                row.append("—" if pair is None else f"{pair['agreement']:.3f} ({_p(pair['p_value'])})")
            lines.append(f"| `{_cell(a)}` | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-replayssm eval compare",
        description="Paired comparison of lm-eval runs (--output_path ... --log_samples): accuracy ± SE per arm, "
                    "per-question agreement and exact McNemar tests against the first run, as a Markdown table.",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="an lm-eval results_<date>.json, or a folder holding exactly one (e.g. the --output_path)")
    parser.add_argument("--task", help="task to compare (default: the one task all runs logged samples for)")
    parser.add_argument("--metric", help="metric or metric,filter (default: acc, else exact_match; filter none, "
                                         "else the first one reported), e.g. exact_match,flexible-extract")
    parser.add_argument("--names", help="comma-separated arm names, one per run (default: from model_args)")
    parser.add_argument("--out", help="also write the Markdown report to this file")
    parser.add_argument("--json", dest="json_out", help="also write the full comparison as JSON to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        parser.error("give at least two runs to compare")
    names = None if args.names is None else [n.strip() for n in args.names.split(",")]
    try:
        report = compare_runs(args.runs, task=args.task, metric=args.metric, names=names)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    print(report["markdown"], end="")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report["markdown"], encoding="utf-8")
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
