#!/usr/bin/python3
"""herd against a baseline, side by side on this machine, with the same workload and cores.

usage:
  compare.py echo      [options]   herd vs the raw fabric echo (bench/echo: no store)
  compare.py memcached [options]   herd vs memcached (one thread, loopback TCP, binary protocol)
  compare.py revision --baseline_bin DIR [options]
                                   herd vs herd as built elsewhere (DIR: another tree's
                                   bazel-bin; scripts/compare_revisions.sh REV makes one)

Each repetition runs herd (herd_server with one worker pinned to --server_core, herd_client
pinned to --client_core) and then the baseline (its server on --server_core, its client on
--client_core), so both see the same machine state; the medians over repetitions are compared.
Every run's JSON goes to --out. The last stdout line is
  {"herd_mops":..,"echo_mops":..,"ratio":..}      (ratio = herd / baseline)
or {"herd_mops":..,"memcached_mops":..,"ratio":..} or {"herd_mops":..,"revision_mops":..,..}. Concurrency matches: herd's logical clients
(--clients, each with --window requests outstanding) are the echo's logical clients and
memcached's pipelined connections.
"""
import argparse
import json
import os
import pathlib
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import cost_breakdown  # noqa: E402
import exp_hosts  # noqa: E402
import herd_exp  # noqa: E402  (its process handling: readiness lines, cleanup on every exit)

REPO = herd_exp.REPO
LOCAL = exp_hosts.Host({"name": "local", "address": "localhost", "role": "server"}, herd_exp.REPO)
# How long memcached may take to accept connections once started.
MEMCACHED_READY_TIMEOUT_S = 10
# --profile: perf starts this long after the warm-up and stops this long before the run ends.
PROFILE_MARGIN_S = 0.25
# memcached's memory limit: room for the preloaded keys many times over.
MEMCACHED_MEMORY_MB = 1024


def pinned(core, argv):
    """For memcached only: an outside binary with no pinning flag of its own. herd's binaries and
    baselines pin themselves with hwloc (--worker_cores, --client_cores, --core), one way."""
    return ["taskset", "-c", str(core)] + argv


class Comparison:
    def __init__(self, args):
        self.args = args
        self.out = pathlib.Path(args.out or REPO / "results" / f"compare_{args.baseline}")
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        self.bin = herd_exp.bazel_bin(args.build)
        self.processes = herd_exp.Processes()
        self.fabric = shlex.split(args.fabric_flags)
        if "--fabric=shm" in self.fabric:
            # A fabric of its own: a herd run elsewhere on this machine never sees this one.
            self.fabric.append(f"--shm_fabric_name=compare-{os.getpid()}")

    def budget(self):
        return self.args.warmup_s + self.args.duration_s + herd_exp.CLIENT_SLACK_S

    def workload_flags(self):
        a = self.args
        return [f"--workload={a.workload}", f"--distribution={a.distribution}",
                f"--keys={a.keys}", f"--key_bytes={a.key_bytes}",
                f"--value_bytes={a.value_bytes}"]

    def timing_flags(self):
        return [f"--duration_s={self.args.duration_s}", f"--warmup_s={self.args.warmup_s}"]

    def run_client(self, argv, name, server=None):
        with open(self.out / "logs" / f"{name}.client.log", "wb") as log:
            client = self.processes.start(LOCAL, argv,
                                          subprocess.PIPE, log)
            profiles = {}
            try:
                profiles = self.start_profiles(name, server, client)
                stdout = herd_exp.read_to_end(client, self.budget())
                for side, recorder in profiles.items():
                    try:
                        recorder.wait(timeout=self.budget())
                    except subprocess.TimeoutExpired:
                        raise herd_exp.PointFailed(f"{name}: perf record of the {side} hung")
                    # -SIGTERM: perf's own workload (sleep) was ended early because the
                    # profiled process exited first (perf record then ends with it): the
                    # samples it took stand.
                    if recorder.returncode not in (0, -signal.SIGTERM):
                        raise herd_exp.PointFailed(
                            f"{name}: perf record of the {side} exited {recorder.returncode} "
                            f"(see {self.profile_path(name, side)}.log)")
            finally:
                for recorder in profiles.values():
                    if recorder.poll() is None:
                        recorder.kill()
                        recorder.wait()
                self.processes.stop(client, timeout=5)
        if client.returncode != 0:
            raise herd_exp.PointFailed(f"{name} client exited {client.returncode} "
                                       f"(see {self.out}/logs/{name}.client.log)")
        return herd_exp.last_json_line(stdout.decode(errors="replace"), f"{name} client")

    def start_profiles(self, name, server, client):
        """--profile: once the warm-up is over, `perf record -g` of the server and of the client
        for the measured window less PROFILE_MARGIN_S at each end; {side: perf process}."""
        if not self.args.profile or server is None:
            return {}
        time.sleep(self.args.warmup_s + PROFILE_MARGIN_S)
        seconds = self.args.duration_s - 2 * PROFILE_MARGIN_S
        recorders = {}
        for side, process in (("worker", server), ("client", client)):
            argv = ["perf", "record", "-q", "-e", "cpu-clock", "-g", "-F",
                    str(self.args.profile_hz), "-p", str(process.pid), "-o",
                    str(self.profile_path(name, side)), "--", "sleep", f"{seconds:.3f}"]
            with open(f"{self.profile_path(name, side)}.log", "wb") as log:
                recorders[side] = subprocess.Popen(argv, stdout=log, stderr=log)
        return recorders

    def profile_path(self, name, side):
        return self.out / "logs" / f"{name}.{side}.perf"

    def add_breakdown(self, result, name):
        """--profile: the run's per-request cost by category on each side (cost_breakdown.py)."""
        seconds = self.args.duration_s - 2 * PROFILE_MARGIN_S
        ops = result["mops"] * 1e6 * seconds
        try:
            result["breakdown"] = {
                side: cost_breakdown.breakdown(self.profile_path(name, side), side, ops)
                for side in ("worker", "client")}
        except (ValueError, subprocess.CalledProcessError) as error:
            raise herd_exp.PointFailed(f"{name}: no cost breakdown: {error}")

    def run_with_server(self, server_argv, ready_prefix, client_argv, name):
        """Starts a server that prints `ready_prefix ... port=N`, runs the client against it."""
        with open(self.out / "logs" / f"{name}.server.log", "wb") as log:
            server = self.processes.start(LOCAL, server_argv, subprocess.PIPE, log)
            try:
                ready = herd_exp.read_line_until(server, ready_prefix,
                                                 herd_exp.SERVER_READY_TIMEOUT_S)
                port = ready.split("port=", 1)[1].split()[0]
                result = self.run_client(client_argv(port), name, server)
                if self.args.profile:
                    self.add_breakdown(result, name)
                return result
            finally:
                self.processes.stop(server, herd_exp.SERVER_STOP_TIMEOUT_S)

    def run_herd(self, name, bin_dir=None):
        a = self.args
        bin_dir = bin_dir or self.bin
        server = [str(bin_dir / "herd" / "herd_server"), "--port=0", "--workers=1",
                  f"--worker_cores={a.server_core}", f"--window={a.window}",
                  f"--max_clients={max(64, a.clients)}",
                  f"--max_key_bytes={max(16, a.key_bytes)}"] + self.fabric
        client = lambda port: ([str(bin_dir / "bench" / "herd_client"), f"--server=127.0.0.1:{port}",
                                f"--clients_per_thread={a.clients}",
                                f"--client_cores={a.client_core}"] + self.fabric +
                               self.workload_flags() + self.timing_flags())
        return self.run_with_server(server, "herd_server ready", client, name)

    def run_revision(self, name):
        """herd as another tree built it, with the same flags (both trees must know them)."""
        return self.run_herd(name, pathlib.Path(self.args.baseline_bin))

    def run_echo(self, name):
        a = self.args
        server = [str(self.bin / "bench" / "echo_server"), "--port=0", f"--core={a.server_core}",
                  f"--window={a.window}", f"--max_clients={max(64, a.clients)}",
                  f"--key_bytes={a.key_bytes}", f"--value_bytes={a.value_bytes}"] + self.fabric
        client = lambda port: ([str(self.bin / "bench" / "echo_client"), f"--server=127.0.0.1:{port}",
                                f"--clients={a.clients}", f"--core={a.client_core}"] +
                               self.fabric + self.timing_flags())
        return self.run_with_server(server, "echo_server ready", client, name)

    def run_memcached(self, name):
        a = self.args
        port = free_port()
        argv = ["memcached", "-t", "1", "-p", str(port), "-l", "127.0.0.1", "-U", "0",
                "-m", str(MEMCACHED_MEMORY_MB)]
        if os.geteuid() == 0:
            argv += ["-u", "nobody"]  # memcached refuses to run as root
        with open(self.out / "logs" / f"{name}.server.log", "wb") as log:
            server = self.processes.start(LOCAL, pinned(a.server_core, argv), log, log)
            try:
                wait_for_port(port, server)
                client = [str(self.bin / "bench" / "memcached_bench"), f"--server=127.0.0.1:{port}",
                          f"--connections={a.clients}", f"--window={a.window}",
                          f"--core={a.client_core}"]
                return self.run_client(client + self.workload_flags() + self.timing_flags(),
                                       name)
            finally:
                self.processes.stop(server, timeout=5)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, process):
    """Readiness of a server that prints nothing: it accepts a TCP connection."""
    deadline = time.monotonic() + MEMCACHED_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise herd_exp.PointFailed(f"memcached exited ({process.returncode}) before "
                                       "accepting connections")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise herd_exp.PointFailed(f"memcached did not accept on port {port} within "
                               f"{MEMCACHED_READY_TIMEOUT_S} s")


def median_breakdown(runs, side):
    """Per category, the median over runs of ns per request (0 where a run had none)."""
    names = []
    for run in runs:
        names += [n for n in run[side] if n not in names]
    return {n: statistics.median(run[side].get(n, 0) for run in runs) for n in names}


def print_breakdowns(breakdowns):
    """--profile: one markdown table per side, medians over repetitions, to stderr."""
    for side in ("worker", "client"):
        columns = [(label, median_breakdown(runs, side))
                   for label, runs in breakdowns.items() if runs]
        print(f"[compare] {side} side, median ns per request:\n" +
              cost_breakdown.table(columns), file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("baseline", choices=["echo", "memcached", "revision"])
    parser.add_argument("--baseline_bin",
                        help="revision: the other tree's bazel-bin (herd/herd_server and "
                             "bench/herd_client under it)")
    parser.add_argument("--clients", type=int, default=4, help="logical clients / connections")
    parser.add_argument("--window", type=int, default=4, help="outstanding requests per client")
    parser.add_argument("--workload", default="C", help="YCSB mix (echo: C only)")
    parser.add_argument("--distribution", default="uniform")
    parser.add_argument("--keys", type=int, default=100000)
    parser.add_argument("--key_bytes", type=int, default=16)
    parser.add_argument("--value_bytes", type=int, default=32)
    parser.add_argument("--duration_s", type=float, default=3)
    parser.add_argument("--warmup_s", type=float, default=1)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--server_core", type=int, default=0)
    parser.add_argument("--client_core", type=int, default=1)
    parser.add_argument("--fabric_flags", default="--fabric=shm",
                        help="fabric flags for herd and the echo, e.g. '--fabric=verbs --device=rxe0'")
    parser.add_argument("--build", default="opt", help="bazel config: opt, portable_opt, default")
    parser.add_argument("--no-build", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="perf-record both sides of each run; per-request cost breakdowns "
                             "(scripts/cost_breakdown.py) in each run's JSON and a table per side")
    parser.add_argument("--profile_hz", type=int, default=2999, help="perf sampling frequency")
    parser.add_argument("--out", help="results directory (default results/compare_<baseline>)")
    args = parser.parse_args()
    if args.baseline == "echo" and args.workload != "C":
        herd_exp.fail("the echo answers GETs: compare it with --workload=C")
    if args.baseline == "revision":
        if not args.baseline_bin:
            herd_exp.fail("revision needs --baseline_bin (scripts/compare_revisions.sh REV)")
        for binary in ("herd/herd_server", "bench/herd_client"):
            if not (pathlib.Path(args.baseline_bin) / binary).is_file():
                herd_exp.fail(f"--baseline_bin: no {binary} under {args.baseline_bin}")
    if args.repetitions < 1 or args.clients < 1 or args.window < 1:
        herd_exp.fail("--repetitions, --clients and --window must be at least 1")
    if not args.no_build:
        herd_exp.build_targets(args.build, ["//herd:herd_server", "//bench:herd_client",
                                            "//bench:echo_server", "//bench:echo_client",
                                            "//bench:memcached_bench"])
    if args.profile:
        if args.duration_s <= 2 * PROFILE_MARGIN_S:
            herd_exp.fail(f"--profile needs --duration_s over {2 * PROFILE_MARGIN_S} s")
        problem = cost_breakdown.perf_unusable()
        if problem:
            herd_exp.fail(f"--profile: {problem}")
    comparison = Comparison(args)
    baseline = {"echo": comparison.run_echo, "memcached": comparison.run_memcached,
                "revision": comparison.run_revision}[args.baseline]
    herd_mops, baseline_mops = [], []
    breakdowns = {"herd": [], args.baseline: []}
    try:
        for r in range(args.repetitions):
            for label, run, mops in (("herd", comparison.run_herd, herd_mops),
                                     (args.baseline, baseline, baseline_mops)):
                name = f"{label}_r{r}"
                result = run(name)
                (comparison.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
                mops.append(result["mops"])
                if "breakdown" in result:
                    breakdowns[label].append(result["breakdown"])
                print(f"[compare] {name}: {result['mops']:.4f} Mops, p50 {result['p50_us']} us, "
                      f"p99 {result['p99_us']} us", file=sys.stderr)
    except herd_exp.PointFailed as error:
        herd_exp.fail(str(error))
    except KeyboardInterrupt:
        herd_exp.fail("interrupted")
    finally:
        comparison.processes.stop_all()
    if args.profile:
        print_breakdowns(breakdowns)
    herd = statistics.median(herd_mops)
    other = statistics.median(baseline_mops)
    print(json.dumps({"herd_mops": round(herd, 4), f"{args.baseline}_mops": round(other, 4),
                      "ratio": round(herd / other, 3) if other > 0 else None},
                     separators=(",", ":")))


if __name__ == "__main__":
    try:
        main()
    except herd_exp.HerdExpError as error:
        print(f"compare: {error}", file=sys.stderr)
        sys.exit(2)
