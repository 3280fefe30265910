#!/usr/bin/python3
"""Tests of scripts/cost_breakdown.py: stacks are attributed to the first frame (leaf first)
that a rule names, times are summed per request; and compare.py --profile records both sides
of a real herd and echo run and reports a breakdown of each (skipped where perf cannot record).
Needs the opt binaries for the end-to-end case (scripts/test.sh builds them first).

usage: tests/scripts/cost_breakdown_test.py [-v]
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
sys.path.insert(0, str(REPO / "scripts"))
import cost_breakdown  # noqa: E402

RUN_BUDGET_S = 180
CLIENT_CORE = 1 if (os.cpu_count() or 1) > 1 else 0


class CategorizeTest(unittest.TestCase):
    def test_leaf_first_attribution(self):
        samples = [
            # a libc copy called by the parser is parsing
            (100, ["__memmove_avx512_unaligned_erms", "herd::ParseRequest",
                   "herd::Worker::Admit", "herd::Worker::GatherFromSlots", "herd::Worker::Run"]),
            # the shm fabric's delivery under post_send is the fabric's, not the post's
            (300, ["transport::shm::PushCompletion", "transport::shm::ShmQp::Deliver",
                   "transport::shm::ShmQp::PostSend", "herd::SendChains::Post"]),
            (50, ["transport::shm::ShmQp::PostSend", "herd::SendChains::Post"]),
            (20, ["mica::KeyHash", "mica::Partition::ExecuteBatch"]),
            (30, ["mica::Partition::FindSlot", "mica::Partition::ExecuteBatch"]),
            (7, ["[k]do_syscall_64"]),
            (3, ["[unknown]"]),
        ]
        totals = cost_breakdown.categorize(samples, cost_breakdown.WORKER_RULES)
        self.assertEqual(dict(totals), {"parse+check": 100, "fabric": 300, "post": 50,
                                        "hash": 20, "store": 30, "kernel": 7, "other": 3})

    def test_client_rules(self):
        samples = [(40, ["__vdso_clock_gettime", "herd::Client::Poll"]),
                   (10, ["herd::Client::CanSubmit", "RunThread"])]
        totals = cost_breakdown.categorize(samples, cost_breakdown.CLIENT_RULES)
        self.assertEqual(dict(totals), {"clock": 40, "submit+windows": 10})

    def test_per_request_divides_and_refuses_an_empty_measurement(self):
        rules = cost_breakdown.WORKER_RULES
        result = cost_breakdown.per_request({"store": 600, "fabric": 1000}, rules, 10)
        self.assertEqual(result, {"fabric": 100.0, "store": 60.0, "total": 160.0})
        with self.assertRaisesRegex(ValueError, "no samples"):
            cost_breakdown.per_request({}, rules, 10)
        with self.assertRaisesRegex(ValueError, "0 requests"):
            cost_breakdown.per_request({"store": 1}, rules, 0)

    def test_table_has_every_category_and_the_total(self):
        text = cost_breakdown.table([("herd", {"store": 60.0, "total": 100.0}),
                                     ("echo", {"echo loop": 40.0, "total": 50.0})])
        lines = text.splitlines()
        self.assertEqual(lines[0], "| ns / request | herd | echo |")
        self.assertIn("| store | 60.0 | 0.0 |", lines)
        self.assertIn("| echo loop | 0.0 | 40.0 |", lines)
        self.assertEqual(lines[-1], "| total | 100.0 | 50.0 |")


class ProfileEndToEndTest(unittest.TestCase):
    def test_compare_profile_reports_both_sides(self):
        problem = cost_breakdown.perf_unusable()
        if problem:
            self.skipTest(problem)
        out = tempfile.mkdtemp(prefix="herd-breakdown-test-")
        try:
            command = [sys.executable, str(REPO / "scripts" / "compare.py"), "echo",
                       "--no-build", "--repetitions=1", "--duration_s=2.0", "--warmup_s=0.2",
                       "--clients=2", "--keys=2000", f"--client_core={CLIENT_CORE}",
                       f"--out={out}", "--profile"]
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                                  timeout=RUN_BUDGET_S)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn("worker side, median ns per request", done.stderr)
            for name, own in (("herd_r0", "store"), ("echo_r0", "echo loop")):
                run = json.loads((pathlib.Path(out) / f"{name}.json").read_text())
                worker = run["breakdown"]["worker"]
                self.assertGreater(worker["total"], 0, name)
                self.assertIn(own, worker, name)
                self.assertGreater(run["breakdown"]["client"]["total"], 0, name)
                # the parts add up to the total (each rounded to 0.1 ns)
                parts = sum(v for k, v in worker.items() if k != "total")
                self.assertAlmostEqual(parts, worker["total"], delta=0.1 * len(worker))
        finally:
            shutil.rmtree(out, ignore_errors=True)

    def test_profile_refuses_a_window_too_short_to_record(self):
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "compare.py"), "echo",
                               "--no-build", "--duration_s=0.3", "--profile"], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 2)
        self.assertIn("--profile needs --duration_s", done.stderr)


if __name__ == "__main__":
    unittest.main()
