#!/usr/bin/env python3
"""Count the GoogleTest cases in the test.xml files under a bazel-testlogs tree.

Bazel keeps each target's test.xml next to its cached result, so a cached pass still counts its
cases. A target that crashed before writing XML gets a test.xml from Bazel with one failure entry,
which counts as one failed case.

Only the targets named are read, so the stale XML of a deleted test is never counted; a named
target without XML (it did not run) counts as one failure.

Each failed case is also named on standard error ("FAILED <file or target> <Suite.Case>"), so a
caller can repeat the names where a log's tail shows them. For an entry Bazel wrote itself (a
timeout or a crash), the line adds Bazel's message and the case the test.log beside it started
and never finished, so a CI log's tail says which case hung.

usage: gtest_totals.py TESTLOGS_DIR //pkg:target...   -> prints "passed failed skipped"
       gtest_totals.py --xml FILE...                  (XML written by --gtest_output)
"""
import pathlib
import re
import sys
import xml.etree.ElementTree as ElementTree


def xml_path_of(testlogs: pathlib.Path, label: str) -> pathlib.Path:
    package, _, name = label.removeprefix("//").partition(":")
    return testlogs / package / name / "test.xml"


def unfinished_case(log_path: pathlib.Path) -> str:
    """The last case the log started without an OK, FAILED or SKIPPED line for it."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return f"no {log_path.name}"
    started = None
    for line in lines:
        match = re.match(r"\[ +(RUN|OK|FAILED|SKIPPED) +\] (\S+)", line)
        if match is None:
            continue
        if match.group(1) == "RUN":
            started = match.group(2)
        elif match.group(2) == started:
            started = None
    return f"unfinished case: {started}" if started else "every case it started finished"


def count(named_paths):
    """named_paths: (name, test.xml path) pairs; the name is what a failure is reported under."""
    passed = failed = skipped = 0
    for name, xml_path in named_paths:
        if not xml_path.exists():
            print(f"FAILED {name} (no test XML at {xml_path})", file=sys.stderr)
            failed += 1
            continue
        try:
            root = ElementTree.parse(xml_path).getroot()
        except ElementTree.ParseError as error:
            print(f"FAILED {name} (unreadable {xml_path}: {error})", file=sys.stderr)
            failed += 1
            continue
        for case in root.iter("testcase"):
            problem = case.find("failure")
            if problem is None:
                problem = case.find("error")
            if problem is not None:
                suite = case.get("classname", "")
                if suite:
                    print(f"FAILED {name} {suite}.{case.get('name', '?')}", file=sys.stderr)
                else:  # Bazel's own entry: the binary timed out or died
                    message = problem.get("message", "")
                    hung = unfinished_case(xml_path.with_name("test.log"))
                    print(f"FAILED {name} ({message}; {hung})", file=sys.stderr)
                failed += 1
            elif (case.get("status") == "notrun" or case.get("result") == "skipped"
                  or case.find("skipped") is not None):
                skipped += 1
            else:
                passed += 1
    return passed, failed, skipped


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1] == "--xml":
        print(*count([(p, pathlib.Path(p)) for p in sys.argv[2:]]))
    else:
        testlogs = pathlib.Path(sys.argv[1])
        print(*count([(label, xml_path_of(testlogs, label)) for label in sys.argv[2:]]))


if __name__ == "__main__":
    main()
