#!/usr/bin/python3
"""Tests of scripts/original_herd_rxe.sh's host side: the clear refusals (no rdma_bench clone, a
clone without the pinned commit, a malformed client configuration), and, where an rdma_bench
clone is at hand ($HERD_RDMA_BENCH, or the tool library's mirror), that every patch still
applies exactly and the patched original compiles and links (HERD_BUILD_ONLY: no guest). Also
scripts/lib/run_herd.sh's herd run, which it shares with rxe_side_by_side.sh: a run whose client
measured nothing fails.

usage: tests/scripts/original_herd_rxe_test.py [-v]
"""
import os
import pathlib
import subprocess
import tempfile
import unittest

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
SCRIPT = str(REPO / "scripts" / "original_herd_rxe.sh")
# Where `fetch github:efficient/rdma_bench` leaves its git dir on the team's machines.
LIBRARY_MIRROR = pathlib.Path("/work/.mirror/efficient+rdma_bench/repo")
# Refusals come before any build; a build of the original takes seconds.
REFUSAL_BUDGET_S = 30
BUILD_BUDGET_S = 300


def run(args, **env):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
    environment.update(env)
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, env=environment,
                          timeout=BUILD_BUDGET_S)


class OriginalHerdRxeTest(unittest.TestCase):
    def test_without_a_clone_it_says_where_to_get_one(self):
        done = run([])
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("no rdma_bench clone", done.stderr)
        self.assertIn("git clone https://github.com/efficient/rdma_bench", done.stderr)

    def test_a_missing_clone_is_named(self):
        done = run(["/nonexistent/rdma_bench"])
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("not found: /nonexistent/rdma_bench", done.stderr)

    def test_a_clone_without_the_pinned_commit_is_refused(self):
        with tempfile.TemporaryDirectory() as empty:
            subprocess.run(["git", "init", "-q", empty], check=True)
            done = run([empty])
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("does not hold rdma_bench commit", done.stderr)

    def test_a_malformed_configuration_is_refused(self):
        for bad in ("1", "x8", "0x8", "1x8x2", "2 x 4"):
            with self.subTest(config=bad):
                done = run(["/nonexistent"], HERD_ORIGINAL_CONFIGS=bad)
                self.assertNotEqual(done.returncode, 0)
                self.assertIn("is not THREADSxWINDOW", done.stderr)

    def test_the_patched_original_builds(self):
        clone = os.environ.get("HERD_RDMA_BENCH") or (
            str(LIBRARY_MIRROR) if LIBRARY_MIRROR.is_dir() else None)
        if clone is None:
            self.skipTest("no rdma_bench clone (set HERD_RDMA_BENCH)")
        with tempfile.TemporaryDirectory() as build:
            done = run([clone], HERD_BUILD_ONLY="1", HERD_ORIGINAL_BUILD=build,
                       HERD_ORIGINAL_CONFIGS="1x8 2x4")
            self.assertEqual(done.returncode, 0, done.stderr[-2000:])
            self.assertIn("patched 15 places", done.stderr)
            for config in ("t1w8", "t2w4"):
                main = pathlib.Path(build) / config / "main"
                self.assertTrue(os.access(main, os.X_OK), f"{main} was not built")
                # The knobs reached the binary's source: one client thread, window 8.
                header = (pathlib.Path(build) / config / "src/herd/main.h").read_text()
                threads, window = config[1], config[3]
                self.assertIn(f"#define NUM_CLIENTS {threads}\n", header)
                self.assertIn(f"#define WINDOW_SIZE {window} ", header)


# Stand-ins for herd_server and herd_client: the server prints its ready line, and a last line
# when stopped (herd_server's final stats); the client prints the JSON line it is given in $FAKE_CLIENT_JSON.
FAKE_SERVER = """#!/bin/bash
trap 'echo "final stats"; exit 0' TERM
echo "herd_server ready port=4242"
while true; do sleep 0.05; done
"""
FAKE_CLIENT = """#!/bin/bash
echo "$FAKE_CLIENT_JSON"
"""


class RunHerdOnceTest(unittest.TestCase):
    """scripts/lib/run_herd.sh's run_herd_once (both Soft-RoCE side-by-side scripts' herd run)
    fails a run whose client measured no operation, and passes one that did."""

    def run_once(self, client_json):
        with tempfile.TemporaryDirectory() as root:
            for path, text in (("herd/herd_server", FAKE_SERVER), ("bench/herd_client", FAKE_CLIENT)):
                binary = pathlib.Path(root) / path
                binary.parent.mkdir(parents=True, exist_ok=True)
                binary.write_text(text)
                binary.chmod(0o755)
            script = ("source scripts/lib/run_herd.sh; s=(--workers=1); c=(--threads=1); "
                      f"run_herd_once probe {root} {root} s c")
            done = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True,
                                  text=True, timeout=REFUSAL_BUDGET_S,
                                  env={**os.environ, "FAKE_CLIENT_JSON": client_json})
            self.assertTrue((pathlib.Path(root) / "probe.server.json").exists())
            return done

    def test_a_run_that_measured_operations_passes(self):
        done = self.run_once('{"ops": 5, "mops": 0.1}')
        self.assertEqual(done.returncode, 0, done.stderr)

    def test_a_run_that_measured_nothing_fails(self):
        for client_json in ('{"ops": 0, "mops": 0}', "", "not json"):
            with self.subTest(client_json=client_json):
                done = self.run_once(client_json)
                self.assertEqual(done.returncode, 1, done.stderr)
                self.assertIn("probe measured no operation", done.stderr)


if __name__ == "__main__":
    unittest.main()
