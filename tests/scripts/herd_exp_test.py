#!/usr/bin/python3
"""End-to-end tests of scripts/herd_exp.py on this machine's shm fabric: a tiny sweep, resume, a
failing point, Ctrl-C in the middle (nothing left running), and launch over ssh against a real
sshd on loopback. Needs the opt binaries (scripts/test.sh builds them first).

usage: tests/scripts/herd_exp_test.py [-v]
"""
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
RUNNER = [sys.executable, str(REPO / "scripts" / "herd_exp.py")]
# A point runs 0.3 s measured after 0.1 s warm-up; with server start-up a point takes ~1 s.
POINT_BUDGET_S = 60


def experiment(directory, name, sweep, hosts=None, server_extra=""):
    hosts = hosts or ["{name: server, address: localhost, role: server}",
                      "{name: client, address: localhost, role: client}"]
    text = textwrap.dedent(f"""\
        name: {name}
        fabric: shm
        build: opt
        hosts:
        """) + "".join(f"  - {h}\n" for h in hosts) + textwrap.dedent(f"""\
        server: {{workers: 1, pin_workers: false, max_clients: 8, mica_items: 10000,
                  mica_log_bytes: 4194304{server_extra}}}
        client: {{threads: 1, keys: 1000, warmup_s: 0.1, duration_s: 0.3}}
        sweep: {sweep}
        """)
    path = pathlib.Path(directory) / f"{name}.yaml"
    path.write_text(text)
    return path


def herd_processes(tag):
    """PIDs of herd binaries whose command line mentions `tag` (our fabric names carry it)."""
    found = subprocess.run(["pgrep", "-f", tag], capture_output=True, text=True).stdout.split()
    return [p for p in found if int(p) != os.getpid()]


class RecordOrderTest(unittest.TestCase):
    """The demo's table, CSV and plot read records in sweep order: numbers numerically."""

    def test_client_counts_sort_as_numbers_not_strings(self):
        sys.path.insert(0, str(REPO / "scripts"))
        import herd_exp
        with tempfile.TemporaryDirectory() as directory:
            for clients in (16, 1, 2, 32, 4, 8):
                for repetition in (1, 0):
                    record = {"point": {"clients": clients, "request_verb": "uc_write"},
                              "repetition": repetition}
                    name = f"clients={clients}_rep{repetition}.json"
                    (pathlib.Path(directory) / name).write_text(json.dumps(record))
            records = herd_exp.load_records(pathlib.Path(directory))
        order = [(r["point"]["clients"], r["repetition"]) for r in records]
        self.assertEqual(order, [(c, rep) for c in (1, 2, 4, 8, 16, 32) for rep in (0, 1)])


class KnobsTest(unittest.TestCase):
    """Knob routing is read from the binaries' own flags (--helpxml), never a hand-kept list."""

    def test_knobs_come_from_the_binaries(self):
        sys.path.insert(0, str(REPO / "scripts"))
        import herd_exp
        knobs = herd_exp.Knobs.from_binaries(REPO / herd_exp.bazel_bin("opt"))
        self.assertEqual(knobs.role("workers")[0], "server")         # herd/flags.cc
        self.assertEqual(knobs.role("mica_log_bytes")[0], "server")  # mica/flags.cc
        self.assertEqual(knobs.role("keys")[0], "client")            # bench/workload_flags
        self.assertEqual(knobs.role("adaptive_retry")[0], "client")  # bench/herd_client_main
        self.assertEqual(knobs.role("mtu")[0], "both")               # transport/flags.cc
        self.assertEqual(knobs.role("duration_s")[0], "client")      # both define it
        self.assertEqual(knobs.role("clients"), ("client", "clients_per_thread"))
        for reserved in ("port", "server", "fabric", "shm_fabric_name"):
            with self.assertRaises(herd_exp.HerdExpError):
                knobs.role(reserved)
        with self.assertRaises(herd_exp.HerdExpError):
            knobs.role("v")  # glog's, not ours


class HerdExpTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="herd-exp-test-")
        self.out = pathlib.Path(self.dir) / "results"

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_runner(self, path, *extra):
        return subprocess.run(RUNNER + ["run", str(path), "--no-build", "--out", str(self.out)] +
                              list(extra), capture_output=True, text=True,
                              timeout=POINT_BUDGET_S * 4, cwd=REPO)

    def test_tiny_sweep_writes_points_csv_and_plots_and_resumes(self):
        path = experiment(self.dir, "tiny", "{clients: [1, 2]}")
        done = self.run_runner(path)
        self.assertEqual(done.returncode, 0, done.stderr)
        points = sorted(p.name for p in self.out.glob("*.json"))
        self.assertEqual(points, ["clients-1_r0.json", "clients-2_r0.json"])
        record = json.loads((self.out / "clients-2_r0.json").read_text())
        self.assertEqual(record["client_knobs"]["clients"], 2)
        self.assertGreater(record["mops"], 0)
        self.assertEqual(record["clients"][0]["clients"], 2)  # the client really ran 2
        self.assertIn("fabric", record["server"])
        csv_lines = (self.out / "results.csv").read_text().splitlines()
        self.assertEqual(len(csv_lines), 3)
        self.assertTrue(csv_lines[0].startswith("clients,repetition,mops"))
        again = self.run_runner(path)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertEqual(again.stderr.count("done before, kept"), 2)
        plot = subprocess.run(RUNNER + ["plot", str(self.out)], capture_output=True, text=True)
        self.assertEqual(plot.returncode, 0, plot.stderr)
        self.assertGreater((self.out / "throughput.png").stat().st_size, 1000)
        self.assertGreater((self.out / "latency.png").stat().st_size, 1000)

    def test_a_failing_point_is_retried_once_reported_and_the_sweep_goes_on(self):
        # postlist 64 > unsig_batch 8 is a configuration the server refuses at start-up.
        path = experiment(self.dir, "failing", "{postlist: [64, 4]}", server_extra=
                          ", unsig_batch: 8")
        done = self.run_runner(path)
        self.assertEqual(done.returncode, 1)
        self.assertEqual(done.stderr.count("postlist-64_r0: attempt"), 2, done.stderr)
        self.assertIn("FAILED points: postlist-64_r0", done.stderr)
        self.assertTrue((self.out / "postlist-64_r0.failed").exists())
        self.assertTrue((self.out / "postlist-4_r0.json").exists())

    def test_fabric_and_page_knobs_reach_both_binaries(self):
        # shm_async goes to server and client (each opens a device), hugepages to the server.
        path = experiment(self.dir, "knobs", "{shm_async: [true]}",
                          server_extra=", hugepages: \"off\"")
        done = self.run_runner(path)
        self.assertEqual(done.returncode, 0, done.stderr)
        record = json.loads((self.out / "shm_async-True_r0.json").read_text())
        # It ran, so both binaries took their flags (gflags refuses unknown ones).
        self.assertGreater(record["mops"], 0)
        self.assertEqual(record["server_knobs"]["hugepages"], "off")
        self.assertTrue(record["server_knobs"]["shm_async"])
        self.assertTrue(record["client_knobs"]["shm_async"])
        self.assertNotIn("hugepages", record["client_knobs"])

    def test_ctrl_c_stops_everything(self):
        path = experiment(self.dir, "interrupted", "{clients: [1, 2]}")
        text = path.read_text().replace("duration_s: 0.3", "duration_s: 60")
        path.write_text(text)
        runner = subprocess.Popen(RUNNER + ["run", str(path), "--no-build", "--out",
                                            str(self.out)], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        tag = f"exp-{runner.pid}-"
        deadline = time.monotonic() + POINT_BUDGET_S
        while len(herd_processes(tag)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)  # until the server and the client both run
        self.assertGreaterEqual(len(herd_processes(tag)), 2, "the point never started")
        runner.send_signal(signal.SIGINT)
        _, stderr = runner.communicate(timeout=30)
        self.assertEqual(runner.returncode, 130, stderr)
        self.assertEqual(herd_processes(tag), [], "processes left running after Ctrl-C")
        self.assertEqual(list(self.out.glob("*.json")), [])  # no half-written point

    def test_clients_launched_over_ssh_on_loopback(self):
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        if not os.path.exists(sshd):
            self.skipTest("no sshd (openssh-server) on this machine")
        keys = pathlib.Path(self.dir) / "ssh"
        keys.mkdir()
        for key in ("host", "user"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(keys / key)], check=True)
        shutil.copy(keys / "user.pub", keys / "authorized_keys")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = keys / "sshd_config"
        config.write_text(textwrap.dedent(f"""\
            ListenAddress 127.0.0.1
            Port {port}
            HostKey {keys / 'host'}
            AuthorizedKeysFile {keys / 'authorized_keys'}
            PidFile {keys / 'sshd.pid'}
            StrictModes no
            UsePAM no
            PasswordAuthentication no
            """))
        os.makedirs("/run/sshd", exist_ok=True)  # privilege separation directory
        daemon = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE)
        try:
            probe = ["ssh", "-p", str(port), "-i", str(keys / "user"), "-o", "BatchMode=yes",
                     "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                     "127.0.0.1", "true"]
            deadline = time.monotonic() + 10
            while subprocess.run(probe, capture_output=True).returncode != 0:
                if daemon.poll() is not None or time.monotonic() > deadline:
                    self.skipTest(f"sshd did not start: {daemon.stderr.read().decode()[-300:]}")
                time.sleep(0.2)
            client = ("{name: client, address: 127.0.0.1, role: client, ssh_port: %d, "
                      "ssh_key: %s, ssh_options: [StrictHostKeyChecking=no, "
                      "UserKnownHostsFile=/dev/null, LogLevel=ERROR]}" % (port, keys / "user"))
            path = experiment(self.dir, "over_ssh", "{clients: [2]}",
                              hosts=["{name: server, address: localhost, role: server}", client])
            done = self.run_runner(path)
            self.assertEqual(done.returncode, 0, done.stderr)
            record = json.loads((self.out / "clients-2_r0.json").read_text())
            self.assertGreater(record["mops"], 0)
        finally:
            daemon.terminate()
            daemon.wait()
            daemon.stderr.close()


if __name__ == "__main__":
    unittest.main()
