#!/usr/bin/python3
"""End-to-end tests of scripts/compare.py (what compare_echo.sh, compare_memcached.sh and
compare_revisions.sh run): each baseline side by side with herd for a fraction of a second, the
final JSON line, the per-run results, nothing left running, and a clear refusal of a comparison
that makes no sense; and of the other speed tools of issue 37: bench/engine_bench (both phases,
their verb economy) and scripts/scaling.sh (a one-worker point, its summary and plot, a refusal).
Needs the opt binaries (scripts/test.sh builds them first). Nothing here asserts on a speed.

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
OPT_BIN = REPO / "bazel-out" / "k8-opt" / "bin"  # what `bazel build --config=opt` writes


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

    def test_a_revision_against_the_same_binaries(self):
        # compare_revisions.sh builds another revision and runs this; here the "other revision"
        # is this tree's own binaries: the revision path end to end, without a second build.
        code, stdout, stderr = self.compare("revision", f"--baseline_bin={OPT_BIN}")
        self.assertEqual(code, 0, stderr)
        self.check_result(stdout, "revision")

    def test_a_revision_needs_its_binaries(self):
        code, _, stderr = self.compare("revision")
        self.assertNotEqual(code, 0)
        self.assertIn("--baseline_bin", stderr)
        code, _, stderr = self.compare("revision", f"--baseline_bin={self.dir}")
        self.assertNotEqual(code, 0)
        self.assertIn("no herd/herd_server", stderr)


class EngineBenchTest(unittest.TestCase):
    def test_both_phases_answer_every_request_with_one_wr_each(self):
        run = subprocess.run([str(OPT_BIN / "bench" / "engine_bench"), "--duration_s=0.2",
                              "--warmup_s=0.05", "--stage_ops=20000", "--keys=5000", "--core=-1"],
                             cwd=REPO, capture_output=True, text=True, timeout=RUN_BUDGET_S)
        self.assertEqual(run.returncode, 0, run.stderr)
        lines = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
        self.assertEqual([l["phase"] for l in lines], ["get", "put"])
        for line in lines:
            self.assertGreater(line["requests"], 0)
            self.assertGreater(line["engine_ns"], 0)
            # One UD SEND per answer, chained: at most one doorbell per answer, and each
            # batch at most --postlist (16) answers.
            self.assertEqual(line["wrs_per_request"], 1.0)
            self.assertLessEqual(line["doorbells_per_request"], 1.0)
            self.assertLessEqual(line["requests_per_batch"], 16)
            self.assertEqual(set(line["share"]), {"parse", "store", "encode", "rest"})
        # A GET's answer carries its 32-byte value; a PUT's none.
        self.assertGreater(lines[0]["bytes_per_request"], lines[1]["bytes_per_request"])
        # Each line says what pages the store ran on, and 4 KiB pages are said up front unless
        # 2 MiB ones were never asked for.
        for line in lines:
            self.assertIn(line["store_pages_kib"], (4, 2048))
        self.assertEqual(lines[0]["store_pages_kib"] == 4, "on 4 KiB pages" in run.stderr,
                         run.stderr)

    def test_the_mixed_phase_carries_both_ops_in_its_share(self):
        # GET answers carry the 32-byte value, PUT answers none: a mixed phase's bytes per answer
        # lie strictly between the two phases', and move with the share of PUTs.
        def bytes_per_request(phases, percent):
            run = subprocess.run([str(OPT_BIN / "bench" / "engine_bench"), "--duration_s=0.2",
                                  "--warmup_s=0.05", "--stage_ops=20000", "--keys=5000",
                                  "--core=-1", f"--phases={phases}",
                                  f"--mixed_put_percent={percent}"],
                                 cwd=REPO, capture_output=True, text=True, timeout=RUN_BUDGET_S)
            self.assertEqual(run.returncode, 0, run.stderr)
            lines = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
            self.assertEqual([l["phase"] for l in lines], phases.split(","))
            for line in lines:
                self.assertEqual(line["wrs_per_request"], 1.0)
            return {l["phase"]: (l["bytes_per_request"], l["put_percent"]) for l in lines}

        both = bytes_per_request("get,put,mixed", 50)
        get, put, mixed = both["get"][0], both["put"][0], both["mixed"][0]
        self.assertEqual([both[p][1] for p in ("get", "put", "mixed")], [0, 100, 50])
        self.assertLess(put, mixed)
        self.assertLess(mixed, get)
        # Half PUTs: about halfway (the ops are drawn at random; 0.2 s is many thousands).
        self.assertAlmostEqual((mixed - put) / (get - put), 0.5, delta=0.1)
        few_puts = bytes_per_request("mixed", 5)["mixed"][0]
        self.assertGreater(few_puts, mixed)

    def test_only_the_mixed_phase_may_miss_and_its_misses_stay_its_own(self):
        # A 1 MiB log laps every ~13,000 appends, so the mix's PUTs drop keys its GETs then miss:
        # counted, not failed. The PUT phase after it misses nothing and must not inherit them.
        run = subprocess.run([str(OPT_BIN / "bench" / "engine_bench"), "--duration_s=0.2",
                              "--warmup_s=0.05", "--stage_ops=20000", "--keys=5000", "--core=-1",
                              "--phases=mixed,put", "--mica_log_bytes=1048576",
                              "--mica_hugepages=false"],
                             cwd=REPO, capture_output=True, text=True, timeout=RUN_BUDGET_S)
        self.assertEqual(run.returncode, 0, run.stderr)
        lines = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
        self.assertEqual([l["phase"] for l in lines], ["mixed", "put"])
        self.assertGreater(lines[0]["not_found"], 0)
        self.assertEqual(lines[1]["not_found"], 0)

    def test_a_mixed_share_past_100_percent_is_refused(self):
        run = subprocess.run([str(OPT_BIN / "bench" / "engine_bench"), "--phases=mixed",
                              "--mixed_put_percent=101"],
                             cwd=REPO, capture_output=True, text=True, timeout=RUN_BUDGET_S)
        self.assertEqual(run.returncode, 1)
        self.assertIn("--mixed_put_percent=101: not 0..100", run.stderr)

    def test_small_pages_asked_for_are_reported_without_a_warning(self):
        run = subprocess.run([str(OPT_BIN / "bench" / "engine_bench"), "--duration_s=0.1",
                              "--warmup_s=0.05", "--stage_ops=20000", "--keys=5000", "--core=-1",
                              "--phases=get", "--mica_hugepages=false"],
                             cwd=REPO, capture_output=True, text=True, timeout=RUN_BUDGET_S)
        self.assertEqual(run.returncode, 0, run.stderr)
        lines = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
        self.assertEqual([l["store_pages_kib"] for l in lines], [4])
        self.assertNotIn("hugepages", run.stderr)

    def test_a_request_that_cannot_fit_a_slot_is_refused(self):
        run = subprocess.run([str(OPT_BIN / "bench" / "engine_bench"), "--value_bytes=4096"],
                             cwd=REPO, capture_output=True, text=True, timeout=RUN_BUDGET_S)
        self.assertEqual(run.returncode, 1)
        self.assertIn("does not fit --slot_bytes", run.stderr)


    def test_a_store_too_small_for_the_keys_is_a_clear_error(self):
        # A 1 MiB cache-mode log cannot hold 100,000 items: said before any phase, with what to
        # raise (it was a CHECK failure in the store stage).
        run = subprocess.run([str(OPT_BIN / "bench" / "engine_bench"), "--keys=100000",
                              "--mica_log_bytes=1048576", "--core=-1"],
                             cwd=REPO, capture_output=True, text=True, timeout=RUN_BUDGET_S)
        self.assertEqual(run.returncode, 1, run.stderr)
        self.assertIn("keys are not held after the preload", run.stderr)
        self.assertIn("--store_mode=store", run.stderr)


class ScalingTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="herd-scaling-test-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def scaling(self, *extra):
        return subprocess.run(["bash", str(REPO / "scripts" / "scaling.sh"), "--bin", str(OPT_BIN),
                               "--out", self.dir, "--duration_s", "0.3", "--warmup_s", "0.1",
                               "--clients_per_thread", "4"] + list(extra),
                              cwd=REPO, capture_output=True, text=True, timeout=RUN_BUDGET_S)

    def test_one_worker_point_with_summary_and_plot(self):
        run = self.scaling("--workers", "1", "--client_threads", "1")
        self.assertEqual(run.returncode, 0, run.stderr)
        summary = json.loads(run.stdout.strip().splitlines()[-1])
        self.assertEqual([p["workers"] for p in summary["points"]], [1])
        point = summary["points"][0]
        self.assertGreater(point["mops"], 0)
        self.assertEqual(point["speedup"], 1.0)
        self.assertEqual(json.loads((pathlib.Path(self.dir) / "summary.json").read_text()),
                         summary)
        self.assertIn("<svg", (pathlib.Path(self.dir) / "scaling.svg").read_text())
        self.assertEqual(processes_matching(f"--out {self.dir}"), [])

    def test_more_workers_than_half_the_cores_is_refused(self):
        run = self.scaling("--workers", str(2 * (os.cpu_count() or 1)))
        self.assertEqual(run.returncode, 2)
        self.assertIn("does not fit", run.stderr)


if __name__ == "__main__":
    unittest.main()
