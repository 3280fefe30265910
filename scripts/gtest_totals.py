#!/usr/bin/env python3
"""Count the GoogleTest cases in the test.xml files under a bazel-testlogs tree.

Bazel keeps each target's test.xml next to its cached result, so a cached pass still counts its
cases. A target that crashed before writing XML gets a test.xml from Bazel with one failure entry,
which counts as one failed case.

Only the targets named are read, so the stale XML of a deleted test is never counted; a named
target without XML (it did not run) counts as one failure.

usage: gtest_totals.py TESTLOGS_DIR //pkg:target...   -> prints "passed failed skipped"
       gtest_totals.py --xml FILE...                  (XML written by --gtest_output)
"""
import pathlib
import sys
import xml.etree.ElementTree as ElementTree


def xml_path_of(testlogs: pathlib.Path, label: str) -> pathlib.Path:
    package, _, name = label.removeprefix("//").partition(":")
    return testlogs / package / name / "test.xml"


def count(xml_paths):
    passed = failed = skipped = 0
    for xml_path in xml_paths:
        if not xml_path.exists():
            print(f"no test XML at {xml_path}", file=sys.stderr)
            failed += 1
            continue
        try:
            root = ElementTree.parse(xml_path).getroot()
        except ElementTree.ParseError as error:
            print(f"unreadable {xml_path}: {error}", file=sys.stderr)
            failed += 1
            continue
        for case in root.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
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
        print(*count([pathlib.Path(p) for p in sys.argv[2:]]))
    else:
        testlogs = pathlib.Path(sys.argv[1])
        print(*count([xml_path_of(testlogs, label) for label in sys.argv[2:]]))


if __name__ == "__main__":
    main()
