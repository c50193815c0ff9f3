"""Per-file passed / failed / skipped table of a GPU test run, from pytest's junit XML files.

    python3 benchmarks/gpu_suite_summary.py OUT/junit-*.xml [--commit SHA] [--gpu NAME] > summary.md

One markdown table (a row per test file, a total row), then every skip reason with its count per file, then
each failure or error with the first line of its message: the short summary a run commits in its results
README. Reads junit XML written with `--junitxml` (xdist included); several files (shards) add up. A test id
counted in more than one file is counted once, its last outcome kept (a rerun shard replaces an earlier one).
A test that was running when a timeout interrupted pytest is written by xdist as a testcase with neither name nor
class: it has no outcome, so it is counted apart ("cut") and never as a pass.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict

OUTCOMES = ("passed", "failed", "error", "skipped")


def _file_of(classname: str, file_attr: str | None) -> str:
    """test/gpu/test_x.py from junit's `file` attribute or its dotted classname (test.gpu.test_x[.Class])."""
    if file_attr:
        return file_attr
    parts = classname.split(".")
    mods = [p for p in parts if not p[:1].isupper()]  # drop a test class
    return "/".join(mods) + ".py"


def _first_line(text: str | None, width: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    line = line.replace("|", "\\|")
    return line if len(line) <= width else line[: width - 3] + "..."


def read(paths) -> dict:
    """{test id: (file, outcome, message)} over the junit files."""
    out = {}
    for path in paths:
        root = ET.parse(path).getroot()
        for i, case in enumerate(root.iter("testcase")):
            if not case.get("classname") and not case.get("name"):
                out[f"<cut {path} #{i}>"] = ("", "cut", "")
                continue
            f = _file_of(case.get("classname", ""), case.get("file"))
            tid = f"{f}::{case.get('name', '')}"
            outcome, msg = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = "failed" if tag == "failure" else tag
                    msg = el.get("message") or el.text or ""
                    break
            out[tid] = (f, outcome, msg)
    return out


def summarize(results: dict, *, commit: str = "", gpu: str = "") -> str:
    counts = defaultdict(Counter)
    skips = defaultdict(Counter)
    bad = []
    cut = 0
    for tid, (f, outcome, msg) in sorted(results.items()):
        if outcome == "cut":
            cut += 1
            continue
        counts[f][outcome] += 1
        if outcome == "skipped":
            skips[f][_first_line(msg.removeprefix("Skipped: "))] += 1
        elif outcome in ("failed", "error"):
            bad.append((tid, outcome, _first_line(msg)))
    lines = []
    head = "GPU test suite" + (f" on {gpu}" if gpu else "") + (f" at {commit}" if commit else "")
    lines += [f"## {head}", "", "| file | passed | failed | errors | skipped |", "| --- | ---: | ---: | ---: | ---: |"]
    total = Counter()
    for f in sorted(counts):
        c = counts[f]
        total.update(c)
        lines.append(f"| {f} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} |")
    lines.append(f"| **total** | {total['passed']} | {total['failed']} | {total['error']} | {total['skipped']} |")
    if cut:
        lines += ["", f"{cut} tests were running when a timeout interrupted pytest: no outcome, not counted above."]
    if skips:
        lines += ["", "### Skip reasons", "", "| file | count | reason |", "| --- | ---: | --- |"]
        for f in sorted(skips):
            for reason, n in skips[f].most_common():
                lines.append(f"| {f} | {n} | {reason} |")
    if bad:
        lines += ["", "### Failures and errors", ""]
        lines += [f"- `{tid}` ({outcome}): {msg}" for tid, outcome, msg in bad]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", nargs="+", help="junit XML files (pytest --junitxml)")
    ap.add_argument("--commit", default="")
    ap.add_argument("--gpu", default="")
    a = ap.parse_args(argv)
    results = read(a.junit)
    sys.stdout.write(summarize(results, commit=a.commit, gpu=a.gpu))
    return 1 if any(o in ("failed", "error") for _, o, _ in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
