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


def import_herd_exp():
    sys.path.insert(0, str(REPO / "scripts"))
    import herd_exp
    return herd_exp


class PlotTest(unittest.TestCase):
    """plot on synthetic records: a value-size sweep (value_bytes x workload x inline limit)."""

    SIZES = [16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576]

    def setUp(self):
        try:
            import matplotlib  # noqa: F401 (Debian's python3-matplotlib: run with /usr/bin/python3)
        except ImportError:
            self.skipTest("no matplotlib for this interpreter (use /usr/bin/python3)")
        self.herd_exp = import_herd_exp()
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="herd-exp-plot-"))

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def write_records(self, sizes, repetitions=2, derived=True):
        for size in sizes:
            for workload in ("C", "A"):
                for limit in (64, 8192):
                    for repetition in range(repetitions):
                        mops = 1.0 / (1 + size / 4096) * (1 + 0.1 * repetition)
                        inline = size <= limit
                        wrs = 1.0 if inline else (2.0 if workload == "C" else 1.5)
                        client = {"ops": 1000, "mops": mops, "wrs_per_op": wrs,
                                  "payload_bytes_per_op": 80.0 + (0 if inline else size),
                                  "workload": {"mix": workload, "value_bytes": size}}
                        point = {"value_bytes": size, "workload": workload,
                                 "inline_value_limit": limit}
                        record = {"experiment": "value_size_sweep", "fabric": "shm",
                                  "point": point, "repetition": repetition,
                                  "server_knobs": {"workers": 1, "inline_value_limit": limit},
                                  "client_knobs": {"value_bytes": size, "workload": workload},
                                  "mops": mops, "p50_us": 3 + size / 1000,
                                  "p99_us": 9 + size / 100, "clients": [client]}
                        if derived:  # as summarize() writes them; older records lack them
                            record.update(wrs_per_op=wrs, value_mb_s=mops * size,
                                          payload_bytes_per_op=client["payload_bytes_per_op"])
                        name = self.herd_exp.point_id(point, repetition) + ".json"
                        (self.dir / name).write_text(json.dumps(record))

    def test_value_sweep_plots_against_value_size_on_a_log2_axis(self):
        self.write_records(self.SIZES)
        import argparse
        self.assertEqual(self.herd_exp.command_plot(argparse.Namespace(dir=str(self.dir))), 0)
        for name in ("throughput.png", "value_mbps.png", "latency_vs_x.png", "latency.png"):
            self.assertGreater((self.dir / name).stat().st_size, 1000, name)
        self.assertTrue(self.herd_exp.log_x_axis(self.SIZES))
        self.assertEqual([self.herd_exp.size_label(v) for v in self.SIZES],
                         ["16", "64", "256", "1K", "4K", "16K", "64K", "256K", "1M"])

    def test_records_without_derived_fields_get_them_from_their_clients(self):
        self.write_records([1048576], repetitions=1, derived=False)
        records = self.herd_exp.load_records(self.dir)
        out_of_line_get = [r for r in records if r["point"]["workload"] == "C" and
                           r["point"]["inline_value_limit"] == 64][0]
        self.assertEqual(out_of_line_get["wrs_per_op"], 2.0)
        self.assertEqual(out_of_line_get["payload_bytes_per_op"], 80.0 + 1048576)
        self.assertAlmostEqual(out_of_line_get["value_mb_s"],
                               out_of_line_get["mops"] * 1048576, places=2)

    def test_axes_that_stay_linear_and_labels_that_stay_numbers(self):
        log_x_axis, size_label = self.herd_exp.log_x_axis, self.herd_exp.size_label
        self.assertTrue(log_x_axis([1, 2, 4, 8, 16, 32]))  # the clients sweep, as before
        self.assertFalse(log_x_axis([1, 2, 4]))            # within 4x
        self.assertFalse(log_x_axis(["uc_write", "rc_write", "ud_send"]))
        self.assertFalse(log_x_axis([0, 64, 8192]))         # 0 has no log
        self.assertEqual([size_label(v) for v in (1, 3, 1000, 1536, 2048, 1 << 30)],
                         ["1", "3", "1000", "1536", "2K", "1G"])


class ExperimentFilesTest(unittest.TestCase):
    """The bundled experiments name only knobs the binaries have (needs the opt binaries)."""

    def test_every_bundled_experiment_checks_against_the_binaries(self):
        herd_exp = import_herd_exp()
        knobs = herd_exp.Knobs.from_binaries(REPO / herd_exp.bazel_bin("opt"))
        files = sorted((REPO / "bench" / "experiments").glob("*.yaml"))
        self.assertIn("value_size_sweep.yaml", [f.name for f in files])
        for path in files:
            with self.subTest(path.name):
                herd_exp.Experiment(str(path), []).check_knobs(knobs)

    def test_value_size_sweep_server_configs_start(self):
        # Config::Validate runs at start-up: every server configuration the sweep makes (8 KiB
        # slots need WRITE responses; the log must hold a 1 MiB item) must be one it accepts.
        herd_exp = import_herd_exp()
        knobs = herd_exp.Knobs.from_binaries(REPO / herd_exp.bazel_bin("opt"))
        x = herd_exp.Experiment(str(REPO / "bench/experiments/value_size_sweep.yaml"), [])
        x.check_knobs(knobs)
        self.assertEqual(x.sweep["value_bytes"][0], 16)
        self.assertEqual(x.sweep["value_bytes"][-1], 1 << 20)
        server_axes = [a for a in x.sweep if knobs.role(a)[0] in ("server", "both")]
        self.assertEqual(server_axes, ["inline_value_limit"])
        for limit in x.sweep["inline_value_limit"]:
            server = {**x.fixed["server"], "inline_value_limit": limit}
            argv = [str(REPO / herd_exp.bazel_bin("opt") / "herd" / "herd_server"), "--port=0",
                    "--fabric=shm", f"--shm_fabric_name=exp-test-{os.getpid()}-{limit}",
                    "--pin_workers=false", "--duration_s=0.2"] + herd_exp.flags(server)
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            with self.subTest(inline_value_limit=limit):
                self.assertEqual(done.returncode, 0, done.stderr[-2000:])
                self.assertIn(f'"inline_value_limit":{limit}', done.stdout)


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
        # Each attempt's logs are kept: the retry's do not overwrite the first's.
        for attempt in ("postlist-64_r0", "postlist-64_r0.attempt2"):
            log = self.out / "logs" / f"{attempt}.server.log"
            self.assertIn("unsig_batch", log.read_text(), attempt)
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
