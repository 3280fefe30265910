#!/usr/bin/python3
"""End-to-end tests of scripts/compare.py (what compare_echo.sh and compare_memcached.sh run):
each baseline side by side with herd for a fraction of a second, the final JSON line, the
per-run results, nothing left running, and a clear refusal of a comparison that makes no sense.
Needs the opt binaries (scripts/test.sh builds them first).

usage: tests/scripts/compare_test.py [-v]
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
COMPARE = [sys.executable, str(REPO / "scripts" / "compare.py")]
# Two runs of 0.3 s after 0.1 s of warm-up, plus start-up and preload.
RUN_BUDGET_S = 120
CLIENT_CORE = 1 if (os.cpu_count() or 1) > 1 else 0


def processes_matching(pattern):
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [p for p in found.split() if int(p) != os.getpid()]


class CompareTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="herd-compare-test-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def compare(self, baseline, *extra):
        command = COMPARE + [baseline, "--no-build", "--repetitions=1", "--duration_s=0.3",
                             "--warmup_s=0.1", "--clients=2", "--keys=2000",
                             f"--client_core={CLIENT_CORE}", f"--out={self.dir}"] + list(extra)
        process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        stdout, stderr = process.communicate(timeout=RUN_BUDGET_S)
        # Its shm fabric is named after its pid: nothing of it may be left running.
        self.assertEqual(processes_matching(f"compare-{process.pid}"), [])
        return process.returncode, stdout, stderr

    def check_result(self, stdout, baseline):
        result = json.loads(stdout.strip().splitlines()[-1])
        self.assertEqual(set(result), {"herd_mops", f"{baseline}_mops", "ratio"})
        self.assertGreater(result["herd_mops"], 0)
        self.assertGreater(result[f"{baseline}_mops"], 0)
        self.assertAlmostEqual(result["ratio"], result["herd_mops"] / result[f"{baseline}_mops"],
                               delta=0.01 * result["ratio"] + 0.002)
        for name in ("herd_r0", f"{baseline}_r0"):
            run = json.loads((pathlib.Path(self.dir) / f"{name}.json").read_text())
            self.assertGreater(run["ops"], 0, name)
        return result

    def test_echo_side_by_side(self):
        code, stdout, stderr = self.compare("echo")
        self.assertEqual(code, 0, stderr)
        self.check_result(stdout, "echo")
        echo = json.loads((pathlib.Path(self.dir) / "echo_r0.json").read_text())
        herd = json.loads((pathlib.Path(self.dir) / "herd_r0.json").read_text())
        self.assertEqual(echo["clients"], herd["clients"])
        self.assertEqual(echo["stalled"], 0)  # no response lost on the shm fabric

    def test_memcached_side_by_side(self):
        if shutil.which("memcached") is None:
            self.skipTest("memcached is not installed (scripts/setup.sh installs it)")
        before = processes_matching("^memcached ")
        code, stdout, stderr = self.compare("memcached")
        self.assertEqual(code, 0, stderr)
        self.check_result(stdout, "memcached")
        run = json.loads((pathlib.Path(self.dir) / "memcached_r0.json").read_text())
        self.assertEqual(run["failed"], 0)
        self.assertEqual(run["misses"], 0)  # every key was preloaded
        self.assertEqual(processes_matching("^memcached "), before, "memcached left running")

    def test_echo_refuses_a_workload_it_does_not_run(self):
        code, _, stderr = self.compare("echo", "--workload=A")
        self.assertNotEqual(code, 0)
        self.assertIn("--workload=C", stderr)


if __name__ == "__main__":
    unittest.main()
