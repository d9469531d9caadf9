"""Results, always read back from the run log: per-run metrics, one row per (entry, set,
variant), written as results.csv and results.md."""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from engine.data.stats import Z95, wilson
from engine.experiment.cells import Cell
from engine.experiment.plan import GROUPS, Entry, Plan, Variant

# --- results --------------------------------------------------------------------------

COLUMNS = ("entry", "level", "set", "variant", "method", "options", "update_mode", "gate",
           "test_pct", "test_n", "test_low_pct", "test_high_pct", "per_run_test_pct",
           "paper_pct", "val_pct", "steps", "accepted_edits", "calls", "tokens", "cost_usd",
           "runs_finished", "runs_planned", "run_ids")


def _mean(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else None


def _row(entry: Entry, level: str, label: str, variant: Variant, cells: list[Cell],
         metrics: dict[str, dict], scores: list[float | None] | None = None) -> dict:
    """level: entry, task, or a BBH group (nlp, algorithmic, other); a group's score is
    the mean of its tasks' scores, not of its runs."""
    found = [metrics[c.run_id] for c in cells if c.run_id in metrics]
    costs = [m["cost"] for m in found]
    paper_key = {"entry": variant.name, "nlp": f"nlp/{variant.name}",
                 "algorithmic": f"algorithmic/{variant.name}"}.get(level)
    # the test examples of every run pooled: a 95% Wilson interval of the pass rate (0/1
    # scores only; a graded metric's mean has none here)
    n = sum(int(m.get("test_n") or 0) for m in found)
    binary = bool(found) and all(m.get("test_binary") for m in found if m.get("test_n"))
    low, high = wilson(sum(float(m.get("test_sum") or 0) for m in found), n, Z95) \
        if n and binary else (None, None)
    return {
        "test_n": n or None, "test_low_pct": _pct(low), "test_high_pct": _pct(high),
        "per_run_test_pct": " ".join(_num(_pct(m["test"])) for m in found
                                     if m["test"] is not None),
        "entry": entry.name, "level": level, "set": label, "variant": variant.name,
        "method": variant.method, "options": " ".join(f"{k}={v}" for k, v in variant.options),
        "update_mode": variant.update_mode, "gate": variant.gate, "label": variant.describe(),
        "test_pct": _pct(_mean(scores if scores is not None else (m["test"] for m in found))),
        "paper_pct": entry.paper.get(paper_key) if paper_key else None,
        "val_pct": _pct(_mean(m["val"] for m in found)),
        "steps": max((m["steps"] or 0 for m in found), default=None),
        "accepted_edits": sum(m["accepted"] for m in found),
        "calls": sum(m["calls"] for m in found), "tokens": sum(int(m["tokens"]) for m in found),
        "cost_usd": None if not found or None in costs else round(sum(costs), 4),
        "runs_finished": len(found), "runs_planned": len(cells),
        "run_ids": " ".join(c.run_id for c in cells if c.run_id in metrics),
    }


def _pct(value: float | None) -> float | None:
    return None if value is None else round(100 * value, 1)


def result_rows(cells: list[Cell], metrics: dict[str, dict]) -> list[dict]:
    """One row per (entry, set, variant): plain entries, BBH groups (mean over tasks of the
    per-task mean over seeds), then per-task rows."""
    rows, task_rows = [], []
    entries = list(dict.fromkeys(c.entry.name for c in cells))
    for name in entries:
        mine = [c for c in cells if c.entry.name == name]
        entry = mine[0].entry
        for variant in entry.variants:
            vcells = [c for c in mine if c.variant == variant]
            if not entry.tasks:
                label = entry.test_dataset or entry.dataset or "graph's dataset"
                rows.append(_row(entry, "entry", label, variant, vcells, metrics))
                continue
            per_task = {t: [c for c in vcells if c.task == t]
                        for t in dict.fromkeys(c.task for c in vcells)}
            task_rows += [_row(entry, "task", t, variant, tc, metrics)
                          for t, tc in per_task.items()]
            grouped = {g: [t for t in per_task if t in names] for g, (_, names) in GROUPS.items()}
            grouped["other"] = [t for t in per_task
                                if not any(t in ts for ts in grouped.values())]
            for group, tasks in grouped.items():
                if not tasks:
                    continue
                title = GROUPS[group][0] if group in GROUPS else "BBH other"
                scores = [_mean(metrics[c.run_id]["test"] for c in per_task[t]
                                if c.run_id in metrics) for t in tasks]
                rows.append(_row(entry, group, f"{title} ({_plural(len(tasks), 'task')})",
                                 variant, [c for t in tasks for c in per_task[t]], metrics,
                                 scores))
    return rows + task_rows


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


# --- counted by runs, and paired ------------------------------------------------------

PAIRED_COLUMNS = ("entry", "reference", "method", "pairs", "both_pass", "reference_only",
                  "method_only", "neither", "difference_pct", "difference_low_pct",
                  "difference_high_pct", "mcnemar_p")


def learned_runs(cells: list[Cell], metrics: dict[str, dict]) -> list[dict]:
    """Per (entry, variant): of its finished runs, how many ended above their starting
    prompts on validation (the run is the unit: seeds vary the sample, the candidates and
    the model's sampling), with Wilson's 95% interval over runs."""
    out = []
    for entry in dict.fromkeys(c.entry.name for c in cells):
        mine = [c for c in cells if c.entry.name == entry and not c.task]
        for variant in dict.fromkeys(c.variant for c in mine):
            found = [metrics[c.run_id] for c in mine if c.variant == variant
                     and c.run_id in metrics]
            learned = sum(1 for m in found if m.get("val") is not None
                          and m.get("val0") is not None and m["val"] > m["val0"])
            low, high = wilson(learned, len(found), Z95) if found else (None, None)
            out.append({"entry": entry, "method": variant.name, "learned": learned,
                        "runs": len(found), "low_pct": _pct(low), "high_pct": _pct(high)})
    return out


def _span(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f"{low:.0f}–{high:.0f}%"


def mcnemar_p(reference_only: int, method_only: int) -> float:
    """Exact two-sided McNemar test: the discordant pairs against a fair coin."""
    n, k = reference_only + method_only, min(reference_only, method_only)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_difference(both: int, ref_only: int, other_only: int, neither: int
                      ) -> tuple[float, float, float]:
    """The reference's pass rate minus the other's over the same pairs, with the 95%
    interval of Agresti and Min's adjusted Wald (half a pair added to each cell)."""
    n = both + ref_only + other_only + neither
    b, c, m = ref_only + 0.5, other_only + 0.5, n + 2
    diff = (b - c) / m
    half = Z95 * math.sqrt(max(b + c - (b - c) ** 2 / m, 0.0)) / m
    return (ref_only - other_only) / n if n else 0.0, max(-1.0, diff - half), \
        min(1.0, diff + half)


def paired_rows(cells: list[Cell], outcomes: dict[str, dict[str, float]],
                reference: str = "semantic") -> list[dict]:
    """Per entry, `reference` against each other variant on the same seeds and the same
    test examples: each pair is (seed, example), both runs finished and scored it; the
    counts of the four outcomes, the difference of pass rates with its interval, and the
    exact McNemar p. Entries without the reference, or with graded (non 0/1) scores, have
    none."""
    out = []
    for entry in dict.fromkeys(c.entry.name for c in cells):
        mine = [c for c in cells if c.entry.name == entry and not c.task and c.run_id]
        by_seed = {(c.variant.name, c.seed): outcomes.get(c.run_id, {}) for c in mine}
        seeds = sorted({s for v, s in by_seed if v == reference})
        for method in dict.fromkeys(c.variant.name for c in mine):
            if method == reference:
                continue
            counts = [0, 0, 0, 0]  # both, reference only, method only, neither
            for seed in seeds:
                ours, theirs = by_seed[(reference, seed)], by_seed.get((method, seed))
                if theirs is None:
                    continue
                for example in ours.keys() & theirs.keys():
                    a, b = ours[example], theirs[example]
                    if a not in (0.0, 1.0) or b not in (0.0, 1.0):
                        return []
                    counts[0 if a and b else 1 if a else 2 if b else 3] += 1
            if not sum(counts):
                continue
            diff, low, high = paired_difference(*counts)
            out.append(dict(zip(PAIRED_COLUMNS, (
                entry, reference, method, sum(counts), *counts, _pct(diff), _pct(low),
                _pct(high), round(mcnemar_p(counts[1], counts[2]), 4)))))
    return out


def runs_and_pairs_markdown(learned: list[dict], paired: list[dict]) -> list[str]:
    """The two sections under the main table: runs that learned, and the paired test."""
    lines = ["", "## Counted by runs", "",
             "Runs that ended above their starting prompts on validation, of the runs "
             "finished, with Wilson's 95% interval over runs (the run is the unit that "
             "varies with the seed).", "",
             "| entry | method | runs that learned | 95% |", "|---|---|---|---|"]
    lines += [f"| {r['entry']} | {r['method']} | {r['learned']} of {r['runs']} | "
              f"{_span(r['low_pct'], r['high_pct'])} |" for r in learned]
    if paired:
        lines += ["", "## Paired: the reference method against each other method", "",
                  "Pairs are (seed, test example) that both runs scored: same seeds, same "
                  "examples. *difference*: the reference's test pass rate minus the other's, "
                  "in points, with the 95% interval of Agresti and Min's adjusted Wald; *p*: "
                  "the exact McNemar test on the pairs where exactly one passed.", "",
                  "| entry | reference | against | pairs | both pass | reference only | "
                  "other only | neither | difference | 95% | p |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['entry']} | {r['reference']} | {r['method']} | {r['pairs']} | "
                  f"{r['both_pass']} | {r['reference_only']} | {r['method_only']} | "
                  f"{r['neither']} | {r['difference_pct']:+.1f} | "
                  f"{r['difference_low_pct']:+.1f} to {r['difference_high_pct']:+.1f} | "
                  f"{r['mcnemar_p']:.3f} |" for r in paired]
    return lines


def write_results(out_dir: Path, plan: Plan, rows: list[dict], metrics: dict[str, dict],
                  db: str, cells: list[Cell] | None = None) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / "results.csv", out_dir / "results.md"
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    extra: list[str] = []
    if cells:
        from engine.runlog.experiments import test_outcomes

        paired = paired_rows(cells, test_outcomes(db, [c.run_id for c in cells if c.run_id]))
        extra = runs_and_pairs_markdown(learned_runs(cells, metrics), paired)
        if paired:
            with (out_dir / "paired.csv").open("w", newline="", encoding="utf-8") as fh:
                writer = csv.DictWriter(fh, fieldnames=PAIRED_COLUMNS)
                writer.writeheader()
                writer.writerows(paired)
    md_path.write_text(results_markdown(plan, rows, metrics, db) + "\n".join(extra)
                       + ("\n" if extra else ""), encoding="utf-8")
    return md_path, csv_path


def results_markdown(plan: Plan, rows: list[dict], metrics: dict[str, dict], db: str) -> str:
    models = sorted({f"{m['backend']}: {m['model']} forward, {m['optimizer_model']} optimizer"
                     for m in metrics.values()})
    lines = [f"# Results: plan `{plan.name}`", "",
             f"Plan `{plan.path}`; run log `{db}`; written {time.strftime('%Y-%m-%d %H:%M')}.",
             f"Models: {'; '.join(models) or 'no finished runs yet'}.", "",
             "Test and validation scores in percent, mean over seeds; BBH groups are the "
             "mean over their tasks. *test 95%*: Wilson's interval of the pass rate over "
             "the *n* test examples of every run pooled (examples, not seeds, are the unit: "
             "it leaves out how much the proposals of different seeds vary, which *per run* "
             "shows: each run's test %). *paper*: the figure the paper reports (gpt-4o-mini "
             "forward). Calls, tokens and cost are totals, cached replies included at no "
             "cost.", ""]
    lines += markdown_table([r for r in rows if r["level"] != "task"], group_ids=True)
    lines += baseline_notes(rows)
    tasks = [r for r in rows if r["level"] == "task"]
    if tasks:
        lines += ["", "## BBH per task", ""] + markdown_table(tasks, group_ids=False)
    return "\n".join(lines) + "\n"


# Which TextGrad each baseline is. Both use this project's update step (the update prompt
# of engine/prompts/templates.py and the validation gate), not TextGrad's optimizer.
BASELINES = {
    "textgrad": "the paper's formal description of TextGrad: one backward call per input, "
                "showing only that input (no siblings, no example fields)",
    "textgrad-lib": "the TextGrad library's own backward: one call per input, showing "
                    "everything the node's forward call showed, siblings included",
}
BASELINE_MARK = " \u2020"


def baseline_notes(rows: list[dict]) -> list[str]:
    """The footnote under the table: which variant each baseline row is, which one stands
    beside a TextGrad figure from the paper, and whose update step they use."""
    methods = [m for m in BASELINES if any(r["method"] == m for r in rows)]
    if not methods:
        return []
    notes = ["", f"{BASELINE_MARK.strip()} Baselines. The update step both use is this "
             "project's (its update prompt and validation gate), not TextGrad's optimizer."]
    notes += [f"- `{m}`: {BASELINES[m]}." for m in methods]
    for r in rows:
        if r["method"] in BASELINES and r["paper_pct"] is not None and r["level"] != "task":
            notes.append(f"- The paper's {_num(r['paper_pct'])}% for TextGrad on {r['set']} "
                         f"stands beside `{r['method']}`.")
    return notes


def markdown_table(rows: list[dict], group_ids: bool) -> list[str]:
    head = ["entry", "set", "method", "test %", "n", "test 95%", "per run", "paper %",
            "val %", "steps", "accepted edits", "calls", "tokens", "cost $", "runs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        done = f"{r['runs_finished']}/{r['runs_planned']}"
        runs = r["run_ids"] if r["runs_planned"] == 1 or not group_ids else \
            f"{done} (ids in results.csv)"
        if r["runs_finished"] < r["runs_planned"] and r["runs_planned"] == 1:
            runs = "not run"
        label = r["label"] + (BASELINE_MARK if group_ids and r["method"] in BASELINES else "")
        interval = "" if r["test_low_pct"] is None else \
            f"{r['test_low_pct']:.1f}–{r['test_high_pct']:.1f}"
        cells = [r["entry"], r["set"], label, _num(r["test_pct"]), _num(r["test_n"]), interval,
                 r["per_run_test_pct"], _num(r["paper_pct"]),
                 _num(r["val_pct"]), _num(r["steps"]), str(r["accepted_edits"]),
                 f"{r['calls']:,}", f"{r['tokens']:,}",
                 "" if r["cost_usd"] is None else f"{r['cost_usd']:.2f}", runs]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _num(value: Any) -> str:
    return "" if value is None else (f"{value:.1f}" if isinstance(value, float) else str(value))
