#!/usr/bin/python3
"""The experiment runner across hosts, for real: run INSIDE the cluster in a box, five hosts each
with its own network namespace, Soft-RoCE device and sshd (scripts/cluster_vm.sh):

  bazel build --config=opt //herd:herd_server //bench:herd_client //herd:herd_admin
  scripts/cluster_vm.sh --hosts 5 -- /usr/bin/python3 tests/scripts/cluster_test.py [-v]

A sweep whose server and clients are on different hosts measures every point; a replicated point
with the primary, both backups and ZooKeeper on hosts of their own survives a SIGKILL of the
primary with no preloaded key lost; wrong per-host choices are refused before any point, naming
the host; a point that fails on one host is retried, reported and stopped on every host; Ctrl-C
leaves nothing running on any host. After each case no host runs anything but
its sshd.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import unittest

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
RUNNER = ["/usr/bin/python3", str(REPO / "scripts" / "herd_exp.py")]
SWEEP = REPO / "bench" / "experiments" / "cluster_rxe.yaml"
REPLICATION = REPO / "bench" / "experiments" / "cluster_rxe_replication.yaml"
CLUSTER_DIR = pathlib.Path(os.environ.get("HERD_CLUSTER_DIR", "/run/herd-cluster"))
# Short points: the emulated devices move a few thousand messages a second; what is tested is
# that every host does its part, not how fast (1,000 keys: each client process preloads them
# all before it measures).
SHORT = ["--sweep", "duration_s=1", "--sweep", "warmup_s=0.5", "--sweep", "keys=1000"]
# Bounds on waiting for something to happen (polled, never slept through).
RUN_TIMEOUT_S = 900
SETTLE_TIMEOUT_S = 30


def hosts():
    """{namespace: address} of the box (cluster_guest.sh's HERD_CLUSTER_HOSTS)."""
    listing = os.environ.get("HERD_CLUSTER_HOSTS", "")
    return dict(entry.split("=", 1) for entry in listing.split())


def running_on_hosts():
    """{namespace: [command lines]} of what runs in each host's namespace besides its sshd
    listener."""
    found = {}
    for ns in hosts():
        listener = (CLUSTER_DIR / f"sshd-{ns}.pid").read_text().strip()
        pids = subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE, text=True,
                              check=True).stdout.split()
        for pid in pids:
            if pid == listener:
                continue
            try:
                cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
            found.setdefault(ns, []).append(cmdline.replace(b"\0", b" ").decode().strip())
    return found


def run(args, timeout=RUN_TIMEOUT_S):
    return subprocess.run(RUNNER + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout, cwd=REPO, check=False)


class ClusterTest(unittest.TestCase):
    def setUp(self):
        if not hosts():
            self.skipTest("not inside scripts/cluster_vm.sh (no HERD_CLUSTER_HOSTS)")
        self.out = pathlib.Path(tempfile.mkdtemp(prefix="herd-cluster-test-"))
        self.started = time.monotonic()

    def tearDown(self):
        # Nothing of the case may stay on any host (an ssh session's sshd may take a moment to
        # go once its client has).
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while running_on_hosts() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(running_on_hosts(), {}, "left running on the hosts")
        # Where the stage's minutes go (the guest is emulated: each case takes minutes).
        print(f"[{self.id().rsplit('.', 1)[-1]}: {time.monotonic() - self.started:.0f} s]",
              file=sys.stderr, flush=True)

    def records(self, directory):
        return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]

    def test_a_sweep_across_hosts_measures_every_point_on_every_client_host(self):
        done = run(["run", str(SWEEP), "--no-build", "--out", str(self.out), "--sweep",
                    "clients=2", "--sweep", "request_verb=uc_write,rc_write"] + SHORT)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        records = self.records(self.out)
        self.assertEqual(sorted(r["point"]["request_verb"] for r in records),
                         ["rc_write", "uc_write"])
        for record in records:
            # One result per client host (h2, h3, h4), each of which did operations.
            self.assertEqual(len(record["clients"]), 3, record["point"])
            for client in record["clients"]:
                self.assertGreater(client["ops"], 0, record["point"])
            self.assertEqual(record["server_knobs"].get("request_verb"),
                             record["point"]["request_verb"])
        self.assertTrue((self.out / "results.csv").exists())
        self.assertTrue((self.out / "per_get.md").exists())
        plotted = run(["plot", str(self.out)])
        self.assertEqual(plotted.returncode, 0, plotted.stderr[-2000:])
        self.assertTrue((self.out / "throughput.png").exists())

    def test_a_replicated_point_survives_a_failover_with_no_acknowledged_write_lost(self):
        done = run(["run", str(REPLICATION), "--no-build", "--out", str(self.out)] + SHORT)
        self.assertEqual(done.returncode, 0, done.stderr[-3000:])
        (record,) = self.records(self.out)
        failover = record["failover"]
        self.assertIn(failover["new_primary"], ("h2", "h3"))  # a backup host took over
        self.assertGreater(failover["gets_after"], 0)
        self.assertEqual(failover["get_misses_after"], 0)
        self.assertGreater(record["mops"], 0)
        # The primary replicated to both backups on their hosts before it was killed.
        self.assertGreater(record["repl_writes_per_op"], 0)

    def test_wrong_per_host_choices_are_refused_before_any_point_naming_each_host(self):
        text = SWEEP.read_text()
        text = text.replace("role: client,\n     device: rxe2", "role: client,\n     device: rxe9")
        text = text.replace("role: client,\n     device: rxe3",
                            "role: client, gid_index: 7,\n     device: rxe3")
        self.assertNotEqual(text, SWEEP.read_text())
        broken = self.out / "broken.yaml"
        broken.write_text(text)
        done = run(["run", str(broken), "--no-build", "--out", str(self.out / "results")])
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn("host h2 (10.98.0.2): no RDMA device rxe9 there (it has: rxe2)",
                      done.stderr)
        self.assertIn("host h3 (10.98.0.3): GID index 7 of rxe3 is empty", done.stderr)
        self.assertNotIn("host h1", done.stderr)
        self.assertEqual(list((self.out / "results").glob("*.json")), [])

    def test_a_point_failing_on_one_host_is_retried_reported_and_cleaned_up_everywhere(self):
        # h3's client is pinned to a core its host does not have: it fails at start on h3 alone,
        # while the server on h1 and the clients on h2 and h4 run.
        text = SWEEP.read_text().replace("role: client,\n     device: rxe3",
                                         "role: client, cores: \"99\",\n     device: rxe3")
        self.assertNotEqual(text, SWEEP.read_text())
        failing = self.out / "failing.yaml"
        failing.write_text(text)
        done = run(["run", str(failing), "--no-build", "--out", str(self.out / "results"),
                    "--sweep", "clients=1", "--sweep", "request_verb=uc_write"] + SHORT)
        self.assertEqual(done.returncode, 1, done.stderr[-3000:])
        (failed,) = (self.out / "results").glob("*.failed")  # the one point, reported
        name = failed.stem
        self.assertEqual(done.stderr.count(f"{name}: attempt"), 2, done.stderr[-3000:])
        self.assertEqual(done.stderr.count("client on h3 exited"), 2, done.stderr[-3000:])
        self.assertIn(f"FAILED points: {name}", done.stderr)
        self.assertNotIn("left running", done.stderr)  # each attempt's processes all stopped

    def test_ctrl_c_stops_everything_on_every_host(self):
        runner = subprocess.Popen(
            RUNNER + ["run", str(SWEEP), "--no-build", "--out", str(self.out), "--sweep",
                      "clients=2", "--sweep", "request_verb=uc_write", "--sweep",
                      "duration_s=600"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        # Interrupted once the server and every client run on their hosts (the binaries
        # themselves: the runner's checks name them in their command lines too).
        def runs(ns, binary):
            return any(c.split()[0].endswith(f"/{binary}")
                       for c in running_on_hosts().get(ns, []) if c)

        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline and runner.poll() is None:
            if runs("h1", "herd_server") and all(runs(ns, "herd_client")
                                                  for ns in ("h2", "h3", "h4")):
                break
            time.sleep(0.1)
        self.assertIsNone(runner.poll(), "the runner ended before its clients ran")
        runner.send_signal(signal.SIGINT)
        _, stderr = runner.communicate(timeout=RUN_TIMEOUT_S)
        self.assertEqual(runner.returncode, 130, stderr[-2000:])
        self.assertIn("stopped by signal", stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2 if "-v" in sys.argv else 1,
                  argv=[a for a in sys.argv if a != "-v"])
