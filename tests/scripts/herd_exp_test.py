#!/usr/bin/python3
"""End-to-end tests of scripts/herd_exp.py on this machine's shm fabric: a tiny sweep, resume, a
failing point, Ctrl-C in the middle (nothing left running), and launch over ssh against a real
sshd on loopback. Needs the opt binaries (scripts/test.sh builds them first).

usage: tests/scripts/herd_exp_test.py [-v]
"""
import hashlib
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


# Flags as binary_flags reads them (name -> default text), a few of each binary's: enough for
# the knob routing and the hopscotch mapping without building anything.
SERVER_FLAGS = {"workers": "1", "window": "4", "request_verb": "uc_write",
                "response_verb": "ud_send", "max_clients": "64", "duration_s": "0",
                "pin_workers": "true", "mica_items": "1048576", "mica_log_bytes": "268435456",
                "mtu": "4096", "shm_async": "false"}
CLIENT_FLAGS = {"threads": "1", "clients_per_thread": "1", "duration_s": "5", "warmup_s": "1",
                "keys": "100000", "key_bytes": "16", "value_bytes": "32", "workload": "C",
                "distribution": "uniform", "seed": "1", "mtu": "4096", "shm_async": "false"}


def synthetic_experiment(directory, sweep, hosts=None, client_extra=""):
    """An experiment checked against SERVER_FLAGS/CLIENT_FLAGS: (herd_exp, Experiment)."""
    herd_exp = import_herd_exp()
    path = experiment(directory, "synthetic", sweep, hosts=hosts)
    if client_extra:
        path.write_text(path.read_text().replace("duration_s: 0.3", "duration_s: 0.3" +
                                                 client_extra))
    x = herd_exp.Experiment(str(path), [])
    x.check_knobs(herd_exp.Knobs(SERVER_FLAGS, CLIENT_FLAGS))
    return herd_exp, x


class SystemKnobTest(unittest.TestCase):
    """The runner knob `system`: herd's variants are knob bundles, hopscotch its own binaries."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="herd-exp-system-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def runner(self, sweep, **kwargs):
        herd_exp, x = synthetic_experiment(self.dir, sweep, **kwargs)
        return herd_exp, herd_exp.Runner(x, pathlib.Path(self.dir) / "out", None)

    def test_herd_rc_answers_with_rc_writes_and_herd_with_ud_sends(self):
        herd_exp, runner = self.runner("{clients: [1], system: [herd, herd_rc, hopscotch]}")
        self.assertEqual(herd_exp.Knobs(SERVER_FLAGS, CLIENT_FLAGS).role("system"),
                         ("runner", "system"))
        rc = runner.knobs_for("server", {"clients": 1, "system": "herd_rc"})
        self.assertEqual((rc["request_verb"], rc["response_verb"]), ("uc_write", "rc_write"))
        self.assertEqual(runner.knobs_for("server", {"clients": 1, "system": "herd"})
                         ["response_verb"], "ud_send")
        self.assertNotIn("system", rc)
        self.assertNotIn("system", runner.knobs_for("client", {"clients": 1, "system": "herd"}))
        # A sweep axis of the same knob wins over the system's bundle.
        self.assertEqual(runner.knobs_for("server", {"system": "herd_rc",
                                                     "response_verb": "uc_write"})
                         ["response_verb"], "uc_write")

    def test_without_a_system_herd_points_get_exactly_their_knobs(self):
        _, runner = self.runner("{clients: [1, 2]}")
        server = runner.knobs_for("server", {"clients": 2})
        self.assertEqual(server, {"workers": 1, "pin_workers": False, "max_clients": 8,
                                  "mica_items": 10000, "mica_log_bytes": 4194304})
        self.assertIsNone(runner.system_of({"clients": 2}))

    def test_unknown_systems_and_what_hopscotch_cannot_do_are_refused(self):
        herd_exp = import_herd_exp()
        with self.assertRaisesRegex(herd_exp.HerdExpError, "system 'pilaf'"):
            synthetic_experiment(self.dir, "{system: [herd, pilaf]}")
        with self.assertRaisesRegex(herd_exp.HerdExpError, "GETs only"):
            synthetic_experiment(self.dir, "{system: [hopscotch], workload: [C, A]}")
        remote = ["{name: server, address: localhost, role: server}",
                  "{name: over_ssh, address: 127.0.0.1, role: client, ssh_port: 2222}"]
        with self.assertRaisesRegex(herd_exp.HerdExpError, "local hosts only"):
            synthetic_experiment(self.dir, "{system: [hopscotch]}", hosts=remote)
        synthetic_experiment(self.dir, "{system: [herd]}", hosts=remote)  # herd may go remote

    def test_defaults_come_from_the_binary_a_knob_goes_to(self):
        knobs = import_herd_exp().Knobs(SERVER_FLAGS, CLIENT_FLAGS)
        self.assertEqual(knobs.value("duration_s", {}), 5)  # the client's, not the server's 0
        self.assertEqual(knobs.value("window", {}), 4)
        self.assertEqual(knobs.value("clients_per_thread", {"clients": 8}), 8)  # the alias
        self.assertIs(knobs.value("shm_async", {}), False)


class HopscotchPointTest(unittest.TestCase):
    """What a hopscotch point runs, built from the herd knobs of the same point."""

    def setUp(self):
        self.herd_exp = import_herd_exp()
        self.knobs = self.herd_exp.Knobs(SERVER_FLAGS, CLIENT_FLAGS)

    def test_lookups_in_flight_match_herds_outstanding_requests(self):
        flags = self.herd_exp.hop_client_flags(
            self.knobs, {"workers": 2, "threads": 3, "clients": 8, "duration_s": 2})
        # 8 logical clients x window 4 (default) x 2 workers, on each of 3 threads.
        self.assertEqual(flags, {"threads": 3, "window": 64, "duration_s": 2})
        self.assertEqual(self.herd_exp.hop_client_flags(self.knobs, {})["window"], 4)

    def test_trace_has_herds_key_count_distribution_and_seed(self):
        setup = self.herd_exp.hop_trace_setup(self.knobs, {"keys": 5000, "distribution": "zipf",
                                                           "seed": 7})
        self.assertEqual(setup, {"records": 5000, "operations": 5000,
                                 "distribution": "zipfian", "seed": 7})
        with self.assertRaises(self.herd_exp.HerdExpError):
            self.herd_exp.hop_trace_setup(self.knobs, {"distribution": "latest"})

    def test_argv_of_trace_table_server_and_client(self):
        bin_dir = pathlib.Path("bazel-out/k8-opt/bin")
        trace, table = pathlib.Path("/r/hopscotch/t.txt"), pathlib.Path("/r/hopscotch/t.hop")
        make_trace, build = self.herd_exp.hop_prepare_argvs(
            bin_dir, {"records": 5000, "operations": 5000, "distribution": "uniform",
                      "seed": 1}, trace, table)
        self.assertEqual(make_trace[0], "bazel-out/k8-opt/bin/bench/ycsb_trace")
        for flag in ("--records=5000", "--operations=5000", "--distribution=uniform",
                     "--read_proportion=1", "--update_proportion=0", "--insert_proportion=0",
                     "--seed=1", "--out=/r/hopscotch/t.txt.tmp"):
            self.assertIn(flag, make_trace)
        self.assertEqual(build, ["bazel-out/k8-opt/bin/hopscotch/hop_build",
                                 "--trace=/r/hopscotch/t.txt.tmp", "--out=/r/hopscotch/t.hop.tmp"])
        fabric = ["--fabric=shm", "--shm_fabric_name=exp-1-p"]
        self.assertEqual(self.herd_exp.hop_server_argv(bin_dir, table, fabric),
                         ["bazel-out/k8-opt/bin/hopscotch/hop_server",
                          "--table=/r/hopscotch/t.hop", "--port=0", "--read_only"] + fabric)
        self.assertEqual(
            self.herd_exp.hop_client_argv(bin_dir, "127.0.0.1:4242", trace, fabric,
                                          {"threads": 1, "window": 16, "duration_s": 2}),
            ["bazel-out/k8-opt/bin/bench/hop_client", "--servers=127.0.0.1:4242",
             "--trace=/r/hopscotch/t.txt"] + fabric +
            ["--threads=1", "--window=16", "--duration_s=2"])

    def test_a_hop_clients_json_becomes_a_record_like_herds(self):
        client = {"system": "hopscotch", "lookups": 1000, "mops": 1.5, "p50_us": 3.0,
                  "p99_us": 6.0, "misses": 10, "reads": 1010, "rereads": 0,
                  "confirm_reads": 10,
                  "fabric": {"wrs": 1010, "bytes": 1010 * 2048, "doorbells": 100}}
        server = {"uptime_s": 3.0, "fabric": {"wrs": 0, "bytes": 0}}

        class X:
            name, fabric = "read_vs_rpc", "shm"

        record = self.herd_exp.summarize_hop(X, {"clients": 4, "system": "hopscotch"}, 0,
                                             {"workers": 1}, {"keys": 1000}, [client], server)
        self.assertEqual(record["mops"], 1.5)
        self.assertEqual(record["wrs_per_op"], 1.01)
        self.assertEqual(record["payload_bytes_per_op"], 2068.5)
        self.assertEqual(record["round_trips_per_op"], 1.01)  # reads counts the confirmations
        self.assertEqual(record["server_wrs_per_op"], 0)
        self.assertEqual(record["get_miss_ratio"], 0.01)
        self.assertEqual(self.herd_exp.per_op_totals(record),
                         {"total_wrs_per_op": 1.01, "wire_bytes_per_op": 2068.5})
        self.assertEqual(self.herd_exp.client_value_bytes(client), 27)


class ServerCpuTest(unittest.TestCase):
    """Server CPU per GET from /proc/PID/stat."""

    # A real line's shape; the command name holds a space and parentheses.
    STAT = ("4242 (hop (srv) x) S 1 4242 4242 0 -1 4194560 873 0 0 0 250 50 0 0 20 0 3 0 "
            "5001 12345678 900 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0")

    def setUp(self):
        self.herd_exp = import_herd_exp()

    def test_utime_plus_stime_after_the_command_name(self):
        self.assertEqual(self.herd_exp.proc_stat_cpu_seconds(self.STAT, 100), 3.0)

    def test_cores_and_microseconds_per_operation(self):
        fields = self.herd_exp.server_cpu_fields((10.0, 1.0), (12.0, 3.0), 2.0)
        # 2 CPU seconds in 2 s: one core; at 2 Mops, 0.5 us per operation.
        self.assertEqual(fields, {"server_cpu_s": 2.0, "server_cores": 1.0,
                                  "server_cpu_us_per_op": 0.5})
        self.assertIsNone(self.herd_exp.server_cpu_fields((10.0, None), (12.0, 3.0), 2.0)
                          ["server_cpu_us_per_op"])
        self.assertIsNone(self.herd_exp.server_cpu_fields((10.0, 1.0), (12.0, 1.0), 0)
                          ["server_cpu_us_per_op"])

    def test_a_live_local_process_is_sampled_and_a_remote_one_by_its_reported_pid(self):
        class Me:
            pid = os.getpid()

        hosts = self.herd_exp.exp_hosts
        local = hosts.Host({"name": "s", "address": "localhost", "role": "server"}, ".")
        remote = hosts.Host({"name": "s", "address": "10.0.0.9", "role": "server"}, ".")
        sum(range(300000))  # some CPU of our own
        _, seconds = self.herd_exp.cpu_sample(Me, local)
        self.assertGreater(seconds, 0)
        # A remote process whose pid never came back: unknown, not this machine's pid's CPU.
        self.assertIsNone(self.herd_exp.cpu_sample(Me, remote)[1])

        class There:
            pid = os.getpid()
            remote_pid = 4242

        asked = []

        def run(script, timeout_s=None):
            asked.append(script)
            return 0, "100\n4242 (herd_server) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0\n", ""

        remote.run = run
        _, seconds = self.herd_exp.cpu_sample(There, remote)
        self.assertEqual(seconds, 3.0)  # (250 + 50) ticks at 100 per second
        self.assertIn("/proc/4242/stat", asked[0])
        remote.run = lambda script, timeout_s=None: (1, "", "gone")
        self.assertIsNone(self.herd_exp.cpu_sample(There, remote)[1])

    def test_herds_server_figures_per_request_it_answered(self):
        server = {"mops": 2.0, "fabric": {"wrs": 4000000, "bytes": 4000000 * 91}}
        self.assertEqual(self.herd_exp.server_per_op(server, 2.0e6 * 2),
                         {"server_wrs_per_op": 1.0, "server_bytes_per_op": 91.0})
        self.assertEqual(self.herd_exp.server_per_op({"mops": 0}, 0),
                         {"server_wrs_per_op": None, "server_bytes_per_op": None})


class PerGetTableTest(unittest.TestCase):
    """per_get.md and the plots of a three-system sweep, on synthetic records."""

    def setUp(self):
        self.herd_exp = import_herd_exp()
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="herd-exp-per-get-"))
        for clients in (1, 4):
            for system in ("herd", "herd_rc", "hopscotch"):
                hop = system == "hopscotch"
                mops = clients * (2.0 if hop else 1.0) + (0.5 if system == "herd" else 0)
                record = {"experiment": "read_vs_rpc", "fabric": "shm",
                          "point": {"clients": clients, "system": system}, "repetition": 0,
                          "system": system,
                          "server_knobs": {"workers": 1, "response_verb": "rc_write"},
                          "client_knobs": {"keys": 1000, "value_bytes": 27},
                          "mops": mops, "p50_us": 2.0 * clients, "p99_us": 5.0 * clients,
                          "wrs_per_op": 1.0, "server_wrs_per_op": 0.0 if hop else 1.0,
                          "total_wrs_per_op": 1.0 if hop else 2.0,
                          "payload_bytes_per_op": 2048.0 if hop else 88.0,
                          "server_bytes_per_op": 0.0 if hop else 91.0,
                          "wire_bytes_per_op": 2048.0 if hop else 179.0,
                          "round_trips_per_op": 1.0,
                          "server_cores": 0.0 if hop else 1.0,
                          "server_cpu_us_per_op": 0.0 if hop else round(1.0 / mops, 4),
                          "clients": [{"system": "hopscotch"} if hop else
                                      {"ops": 10, "workload": {"value_bytes": 27}}]}
                name = self.herd_exp.point_id(record["point"], 0) + ".json"
                (self.dir / name).write_text(json.dumps(record))

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_one_row_per_system_at_its_peak(self):
        text = self.herd_exp.per_get_table(self.herd_exp.load_records(self.dir))
        rows = [line for line in text.splitlines() if line.startswith("| herd") or
                line.startswith("| hopscotch")]
        self.assertEqual(len(rows), 6, text)  # 3 in each of the two tables
        herd, herd_rc, hop = rows[:3]
        self.assertTrue(herd.startswith("| herd (UC WRITE requests, UD SEND responses) | 4 | "
                                        "4.500 |"), herd)
        self.assertIn("| 2.00 (1.00 + 1.00) | 1.00 | 179 (88 + 91) | 0.222 | 1.00 |", herd)
        self.assertIn("RC WRITE responses", herd_rc)
        self.assertTrue(hop.startswith("| hopscotch (one 2 KiB RDMA READ per GET) | 4 | 8.000 |"))
        self.assertIn("| 1.00 (1.00 + 0.00) | 1.00 | 2048 (2048 + 0) | 0.000 | 0.00 |", hop)
        self.assertIn("| series | 1 | 4 |", text)
        self.assertIn("| herd (UC WRITE requests, UD SEND responses) | 0.667 | 0.222 |", text)

    def test_plot_draws_the_systems_as_lines_and_writes_the_table(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("no matplotlib for this interpreter (use /usr/bin/python3)")
        import argparse
        records = self.herd_exp.load_records(self.dir)
        x_axis, _, groups, order = self.herd_exp.group_records(records)
        self.assertEqual(x_axis, "clients")
        self.assertEqual([dict(key)["system"] for key in order], ["herd", "herd_rc", "hopscotch"])
        self.assertEqual(self.herd_exp.command_plot(argparse.Namespace(dir=str(self.dir))), 0)
        for name in ("throughput.png", "latency.png", "per_get.md"):
            self.assertGreater((self.dir / name).stat().st_size, 500, name)
        # 27-byte values on both sides: no value-size plot.
        self.assertFalse((self.dir / "value_mbps.png").exists())


class HostCheckTest(unittest.TestCase):
    """exp_hosts.check_host against what a host answers (its probe's output canned here; the
    real ssh path runs in tests/scripts/cluster_test.py): every problem named with its host."""

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, str(REPO / "scripts"))
        import exp_hosts
        cls.exp_hosts = exp_hosts

    def host(self, answer, **fields):
        spec = {"name": "h2", "address": "10.98.0.2", "role": "client", **fields}
        host = self.exp_hosts.Host(spec, "/opt/herd")
        host.run = lambda script, timeout_s=None: answer
        return host

    def check(self, host, fabric="verbs", binaries=()):
        return self.exp_hosts.check_host(host, fabric, list(binaries), REPO)

    def probe(self, binaries="", addresses="127.0.0.1 10.98.0.2", devices="rxe2",
              gid="0000:0000:0000:0000:0000:ffff:0a62:0002"):
        return (0, f"checkout /opt/herd\n{binaries}addresses {addresses}\ndevices {devices}\n"
                   f"gid {gid}\n", "")

    def test_a_host_with_its_device_gid_address_and_build_passes(self):
        binary = "scripts/herd_exp.py"  # any file both sides have: the same bytes
        digest = hashlib.sha256((REPO / binary).read_bytes()).hexdigest()
        host = self.host(self.probe(binaries=f"binary {binary} {digest}\n"), device="rxe2",
                         gid_index=1)
        self.assertEqual(self.check(host, binaries=[binary]), [])

    def test_a_missing_or_different_build_is_named(self):
        host = self.host(self.probe(binaries="binary a none\nbinary scripts/herd_exp.py 00\n"))
        problems = self.check(host, binaries=["a", "scripts/herd_exp.py"])
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("host h2 (10.98.0.2): a is not built in /opt/herd", problems[0])
        self.assertIn("scripts/herd_exp.py in /opt/herd differs from this machine's build",
                      problems[1])

    def test_a_device_it_lacks_an_empty_or_absent_gid_and_a_foreign_address_are_named(self):
        self.assertEqual(self.check(self.host(self.probe(), device="rxe9", gid_index=1)),
                         ["host h2 (10.98.0.2): no RDMA device rxe9 there (it has: rxe2)"])
        self.assertEqual(self.check(self.host(self.probe(gid="missing"), device="rxe2",
                                              gid_index=7)),
                         ["host h2 (10.98.0.2): rxe2 has no GID index 7"])
        empty = self.check(self.host(self.probe(gid=self.exp_hosts.EMPTY_GID), device="rxe2",
                                     gid_index=3))
        self.assertIn("GID index 3 of rxe2 is empty", empty[0])
        foreign = self.check(self.host(self.probe(addresses="127.0.0.1 10.98.0.7")))
        self.assertIn("10.98.0.2 is not one of its addresses (10.98.0.7 127.0.0.1)", foreign[0])
        listen = self.check(self.host(self.probe(), listen_address="10.98.0.3"))
        self.assertIn("listen_address 10.98.0.3 is not one of its addresses", listen[0])
        nothing = self.check(self.host(self.probe(devices="")))
        self.assertIn("no RDMA device there", nothing[0])

    def test_a_coordinator_host_needs_no_rdma_device_and_no_herd_binary(self):
        host = self.host(self.probe(devices=""), role="coordinator")
        self.assertEqual(self.check(host, binaries=["herd/missing_binary"]), [])

    def test_an_unreachable_host_or_a_missing_checkout_is_named(self):
        down = self.check(self.host((255, "", "ssh: connect to host 10.98.0.2 port 22: "
                                               "No route to host\n")))
        self.assertEqual(down, ["host h2 (10.98.0.2): cannot run a command there (ssh: connect "
                                "to host 10.98.0.2 port 22: No route to host)"])
        gone = self.check(self.host((3, "", f"{self.exp_hosts.NO_CHECKOUT} /opt/herd\n")))
        self.assertEqual(gone, ["host h2 (10.98.0.2): no checkout at repo /opt/herd"])

    def test_an_ssh_error_naming_a_missing_file_is_not_a_missing_checkout(self):
        problems = self.check(self.host((255, "", "Warning: Identity file /run/herd-cluster/"
                                                  "id_ed25519 not accessible: No such file or "
                                                  "directory.\nPermission denied (publickey).\n")))
        self.assertEqual(problems, ["host h2 (10.98.0.2): cannot run a command there "
                                    "(Permission denied (publickey).)"])

    def test_what_a_login_shell_prints_first_is_skipped(self):
        status, out, err = self.probe()
        self.assertEqual(self.check(self.host((status, "Welcome!\n" + out, err))), [])

    def test_unknown_roles_and_fields_are_refused(self):
        with self.assertRaisesRegex(self.exp_hosts.HostError, "role must be one of"):
            self.exp_hosts.Host({"name": "x", "address": "a", "role": "primary"}, ".")
        with self.assertRaisesRegex(self.exp_hosts.HostError, "unknown fields"):
            self.exp_hosts.Host({"name": "x", "address": "a", "role": "client", "gid": 1}, ".")


class ReadAllToEndTest(unittest.TestCase):
    """The clients of a point are read side by side: one that fails fails the point at once,
    while the others still run (they are stopped by the caller), naming the failed one."""

    def test_the_first_failure_ends_the_wait_and_names_its_host(self):
        sys.path.insert(0, str(REPO / "scripts"))
        import herd_exp
        slow = subprocess.Popen(["sleep", "600"], stdout=subprocess.PIPE,
                                start_new_session=True)
        failing = subprocess.Popen(["bash", "-c", "echo partial; exit 3"],
                                   stdout=subprocess.PIPE)
        logs = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
        try:
            with self.assertRaisesRegex(herd_exp.PointFailed, "client on h3 exited 3"):
                herd_exp.read_all_to_end([("h2", slow, logs[0]), ("h3", failing, logs[1])],
                                         timeout_s=POINT_BUDGET_S)
            self.assertIsNone(slow.poll(), "it waited for the slow one")
        finally:
            slow.kill()
            slow.wait()
            for process in (slow, failing):
                process.stdout.close()

    def test_every_output_once_all_exit_zero(self):
        sys.path.insert(0, str(REPO / "scripts"))
        import herd_exp
        named = [(f"h{i}", subprocess.Popen(["echo", f"out{i}"], stdout=subprocess.PIPE),
                  tempfile.TemporaryFile()) for i in range(3)]
        outputs = herd_exp.read_all_to_end(named, timeout_s=POINT_BUDGET_S)
        self.assertEqual(outputs, {f"h{i}": f"out{i}\n".encode() for i in range(3)})
        for _, process, _ in named:
            process.stdout.close()


class LeftoversTest(unittest.TestCase):
    """exp_hosts.leftovers finds a run's processes by the marker in their environment, kills
    them, and leaves every other process alone."""

    def test_the_runs_processes_are_found_and_killed_and_no_other(self):
        sys.path.insert(0, str(REPO / "scripts"))
        import exp_hosts
        run_id = f"test-{os.getpid()}-{time.time_ns()}"
        marked = subprocess.Popen(["sleep", "600"], start_new_session=True,
                                  env={**os.environ, exp_hosts.MARKER: run_id})
        other = subprocess.Popen(["sleep", "600"], start_new_session=True,
                                 env={**os.environ, exp_hosts.MARKER: run_id + "-other"})
        # A shared ssh connection's master (share_connections) named as OpenSSH names it, started
        # by a command that carried the run's marker: the run's connection, not a leftover.
        master = subprocess.Popen(
            ["bash", "-c", 'exec -a "ssh: /tmp/herd-ssh-x/0f [mux]" sleep 600'],
            start_new_session=True, env={**os.environ, exp_hosts.MARKER: run_id})
        deadline = time.monotonic() + 30  # until bash has exec'd it under the master's name
        while (not pathlib.Path(f"/proc/{master.pid}/cmdline").read_bytes().startswith(b"ssh:")
               and time.monotonic() < deadline):
            time.sleep(0.01)
        try:
            local = exp_hosts.Host({"name": "here", "address": "localhost", "role": "server"},
                                   str(REPO))
            found, unasked = exp_hosts.leftovers([local, local], run_id)
            self.assertEqual(unasked, {})
            self.assertEqual(list(found), ["here"])
            self.assertEqual(found["here"], [f"{marked.pid} sleep 600"])
            self.assertEqual(marked.wait(timeout=30), -signal.SIGKILL)
            self.assertIsNone(other.poll())
            self.assertIsNone(master.poll())
            self.assertEqual(exp_hosts.leftovers([local], run_id), ({}, {}))
        finally:
            for process in (marked, other, master):
                if process.poll() is None:
                    process.kill()
                    process.wait()


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
        log = keys / "sshd.log"  # one "Accepted publickey" line per connection
        daemon = subprocess.Popen([sshd, "-D", "-E", str(log), "-f", str(config)],
                                  stderr=subprocess.PIPE)

        def connections():
            return log.read_text().count("Accepted publickey") if log.exists() else 0

        def masters():  # the shared connections' ssh processes ("ssh: /tmp/herd-ssh-...")
            listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True)
            return [line for line in listing.stdout.splitlines() if "herd-ssh-" in line]

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
            before = connections()
            done = self.run_runner(path)
            self.assertEqual(done.returncode, 0, done.stderr)
            record = json.loads((self.out / "clients-2_r0.json").read_text())
            self.assertGreater(record["mops"], 0)
            # The checks, the client, its CPU samples and the leftover sweeps: one connection,
            # closed when the run ended.
            self.assertEqual(connections() - before, 1, log.read_text()[-2000:])
            deadline = time.monotonic() + 10
            while masters() and time.monotonic() < deadline:
                time.sleep(0.1)
            self.assertEqual(masters(), [])
        finally:
            daemon.terminate()
            daemon.wait()
            daemon.stderr.close()


if __name__ == "__main__":
    unittest.main()
