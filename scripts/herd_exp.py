#!/usr/bin/python3
"""herd's experiment runner: sweeps of server and client knobs across hosts, results, plots.

usage:
  herd_exp.py run FILE.yaml [--sweep AXIS=V1,V2 ...] [--out DIR] [--no-build] [--fresh]
                   [--build opt|portable_opt|default]
  herd_exp.py plot DIR

run   builds the binaries once, then for every sweep point (the cartesian product of the sweep
      axes, times `repetitions`) starts herd_server on the server host, waits for its readiness
      line, runs herd_client on every client host (over ssh unless the host is local), stops the
      server and writes DIR/<point>.json with every knob, the clients' and the server's results,
      their per-operation WRs and bytes (wrs_per_op, payload_bytes_per_op), value_mb_s (Mops x
      value size) and loadavg_1m (this machine's load as the point ended: others' work shows).
      Output goes to DIR/logs/<point>.{server,client0}.log. A point that fails is retried once
      (its logs: <point>.attempt2.*.log), then reported (DIR/<point>.failed holds why) and the
      sweep goes on; the exit status is non-zero if any point failed. A rerun skips points that
      already have a result (resume); --fresh starts over. DIR/results.csv combines the points.
      Ctrl-C stops everything it started, here and on remote hosts.
plot  draws, against the first sweep axis (`clients` if swept), one line per combination of the
      other axes: DIR/throughput.png (Mops), DIR/latency_vs_x.png (p50 and p99, two panels) and,
      when the points' value sizes differ, DIR/value_mbps.png (value payload MB/s = Mops x
      value_bytes); plus DIR/latency.png (p50 and p99 vs Mops). A numeric x axis whose values
      span more than 4x is drawn log2 with a tick at each value (16, 64, 256, 1K, 4K, ..., 1M);
      a y axis whose values span more than 30x, log. Repetitions of a point: their median.
      Titled with the fixed knobs.

The experiment file (see bench/experiments/*.yaml):
  name: clients_sweep                 # results go to results/<name>/ unless --out
  fabric: shm                         # shm (one machine) or verbs
  build: opt                          # bazel config for the binaries: opt, portable_opt, default
  hosts:                              # exactly one server; one or more clients
    - {name: server, address: localhost, role: server, cores: "0"}
    - {name: client0, address: localhost, role: client}
  server: {workers: 1}                # fixed herd_server flags
  client: {duration_s: 3}             # fixed herd_client flags
  sweep: {clients: [1, 2, 4]}         # axes: any server or client flag; see KNOB_ROLES
  repetitions: 1
Host fields: address (localhost/127.0.0.1 = run directly, unless ssh_port is given), role,
cores (server: --worker_cores; client: --client_cores), device and gid_index (verbs), ssh_user, ssh_port, ssh_key,
ssh_options (a list of -o options), repo (the checkout's path there, default this one's; it must
hold the same build).

Runner knobs (no binary's flag; an axis, or a key of `server` or `client`):
  replicas: N   starts N `herd_server --role=backup` beside the server, its primary.
  coordinated: true|false   with replicas: the servers keep their configuration in a private
                ZooKeeper (scripts/zk.sh, started and stopped per point), the backups join the
                primary by state transfer, and the clients start once all N are in sync.
  system: S     which system serves the point's GETs (default herd, the binaries as configured):
    herd       herd_server/herd_client with UC WRITE requests and UD SEND responses;
    herd_rc    the same with RC WRITE responses (--response_verb=rc_write);
    hopscotch  one-sided lookups: each GET is one 2 KiB RDMA READ of a hopscotch table, no server
               CPU. The runner makes, once per results directory (DIR/hopscotch/), a YCSB trace of
               READs of the herd client's `keys` (ycsb_trace; `distribution`, `seed`) and a table
               of it (hop_build), starts `hop_server --read_only` on the server host and runs
               `hop_client` on the client hosts (all local: the files are made here) with herd's
               `threads` and as many lookups in flight per thread as herd's logical clients
               can have requests outstanding (clients x window x workers); `duration_s` is its
               duration (it has no warm-up: its window includes joining). Only GETs (workload C).
Every point also records its server process's CPU: utime+stime from /proc/PID/stat (local
servers) sampled as the clients start and as they exit, as cores busy (server_cores) and per
operation (server_cpu_us_per_op = cores / Mops), and the per-operation figures of both sides:
total_wrs_per_op (client + server WRs), wire_bytes_per_op (payload bytes both ways, headers not
counted), round_trips_per_op. run and plot write DIR/per_get.md: those per series (plot line).
"""
import argparse
import atexit
import csv
import itertools
import json
import os
import pathlib
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import exp_hosts

REPO = pathlib.Path(__file__).resolve().parent.parent

# Which binary a knob belongs to is read from the binaries themselves (--helpxml): a flag that
# herd_server defines is a server knob, one herd_client defines a client knob, one both define
# (the fabric's) goes to both. The server's config is authoritative (clients learn it when they
# join), so every engine and store knob is a server flag.
PROJECT_SOURCES = ("herd/", "mica/", "transport/", "bench/", "util/")
# Flags the runner sets itself from the experiment's hosts and fabric: never knobs.
RUNNER_FLAGS = {"port", "listen_address", "server", "fabric", "device", "shm_fabric_name",
                "gid_index", "ib_port"}
# Knobs of the runner itself, no binary's flag: `replicas` (an axis or a server knob) starts that
# many `herd_server --role=backup` (on the backup hosts, else beside the server) and makes the
# server their primary; `failover` (with coordinated replicas) kills the primary after the
# clients' run and runs them again at the backup that took over.
RUNNER_KNOBS = {"replicas", "system", "coordinated", "failover"}
# failover: how long a backup may take to become the primary once the old one is killed (a
# coordination session's timeout, then the takeover).
FAILOVER_TIMEOUT_S = 120
# failover checks that GETs of preloaded keys still find them: only mixes without DELETEs.
FAILOVER_WORKLOADS = ("A", "B", "C")
# A coordinated point's backups join by state transfer: how long the runner waits for them.
COORDINATED_SYNC_TIMEOUT_S = 120
# `system`: which knobs each herd variant sets (over the experiment's fixed knobs; a sweep axis of
# the same knob wins), and hopscotch (None): the one-sided hop_server/hop_client pair instead.
SYSTEMS = {"herd": {"request_verb": "uc_write", "response_verb": "ud_send"},
           "herd_rc": {"request_verb": "uc_write", "response_verb": "rc_write"},
           "hopscotch": None}
SYSTEM_LABELS = {"herd": "herd (UC WRITE requests, UD SEND responses)",
                 "herd_rc": "herd (UC WRITE requests, RC WRITE responses)",
                 "hopscotch": "hopscotch (one 2 KiB RDMA READ per GET)"}
# hopscotch's values are fixed (hopscotch/format.h kValueBytes).
HOP_VALUE_BYTES = 27
# The runner sets these itself: the server's --backups (the backups' replication ports) and the
# client's --backups (their client ports, for herd_client --read_from).
RUNNER_FLAGS = RUNNER_FLAGS | {"backups"}
# Flags both binaries define where the knob is one side's: the server's --duration_s would stop
# it in the middle of the client's measurement; herd_client links the transport's --hugepages
# but reads no page policy (its buffers are small), so the knob is the server's.
ROLE_OVERRIDES = {"duration_s": "client", "hugepages": "server"}
# Plot titles wrap at this many characters: 8-point text across a 7-inch figure.
TITLE_WRAP_CHARS = 95
# "clients" is the HERD plot's x axis: logical clients per client thread.
ALIASES = {"clients": "clients_per_thread"}

# The first stdout line of a process started on another host: its pid there.
REMOTE_PID_LINE = "herd_exp_pid "
# How long a server may take to print its readiness line (store allocation, hugepages).
SERVER_READY_TIMEOUT_S = 60
# Beyond warm-up and duration, how long a client may take (join, preload, report).
CLIENT_SLACK_S = 120
# How long a stopped server may take to print its final line and exit.
SERVER_STOP_TIMEOUT_S = 20
# Attempts per point: the first, and one retry.
ATTEMPTS = 2
# How long ycsb_trace and hop_build may take each (a table of millions of keys: seconds).
HOP_PREPARE_TIMEOUT_S = 600


class PointFailed(Exception):
    pass


class HerdExpError(Exception):
    """What stops a command, with its reason; main() turns it into an exit status. Raised, never
    sys.exit(): compare.py and the tests import this module."""


def fail(message):
    raise HerdExpError(message)


def binary_flags(path):
    """The flags a binary defines in this project's sources, name -> default (as text), from its
    --helpxml (gflags prints the XML and exits 1)."""
    import xml.etree.ElementTree as ElementTree
    try:
        out = subprocess.run([str(path), "--helpxml"], capture_output=True, text=True,
                             timeout=60).stdout
        root = ElementTree.fromstring(out)
    except (OSError, subprocess.TimeoutExpired, ElementTree.ParseError) as error:
        fail(f"{path}: cannot read its flags ({error}); build it first")
    return {flag.findtext("name"): flag.findtext("default") for flag in root.iter("flag")
            if (flag.findtext("file") or "").startswith(PROJECT_SOURCES)}


def parse_default(text):
    """A flag's default as --helpxml writes it: 4 -> 4, 0.5 -> 0.5, true -> True, C -> 'C'."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except (TypeError, ValueError):
            pass
    return text


class Knobs:
    """Which binary each knob goes to, derived from the two binaries' own flags."""

    def __init__(self, server_flags, client_flags):
        """Each: the flag names, or name -> default (binary_flags)."""
        server = set(server_flags) - RUNNER_FLAGS
        client = set(client_flags) - RUNNER_FLAGS
        self.roles = {}
        for name in server | client:
            both = name in server and name in client
            self.roles[name] = ROLE_OVERRIDES.get(name) or (
                "both" if both else "server" if name in server else "client")
        # Each knob's default, from the binary it goes to (the client's duration_s, not the
        # server's); known where the flags came with their defaults (binary_flags).
        self.defaults = {}
        for name, role in self.roles.items():
            given = client_flags if role == "client" else server_flags
            if isinstance(given, dict) and name in given:
                self.defaults[name] = parse_default(given[name])

    @staticmethod
    def from_binaries(bin_dir):
        return Knobs(binary_flags(bin_dir / "herd" / "herd_server"),
                     binary_flags(bin_dir / "bench" / "herd_client"))

    def role(self, name):
        name = ALIASES.get(name, name)
        if name in RUNNER_KNOBS:
            return "runner", name
        if name not in self.roles:
            by_role = {r: sorted(n for n, rr in self.roles.items() if rr == r)
                       for r in ("server", "client", "both")}
            fail(f"unknown knob '{name}' (server: {by_role['server']}; client: "
                 f"{by_role['client']}; both: {by_role['both']})")
        return self.roles[name], name

    def value(self, name, given):
        """A knob's value: `given`'s (keys as the experiment writes them, aliases too), else the
        binary's default."""
        for key, value in given.items():
            if ALIASES.get(key, key) == name:
                return value
        if name not in self.defaults:
            fail(f"knob '{name}': no value given and no default known")
        return self.defaults[name]


# ------------------------------------------------------------------------------ the experiment
class Experiment:
    FIELDS = {"name", "description", "fabric", "build", "hosts", "server", "client", "sweep",
              "repetitions"}

    def __init__(self, path, overrides):
        import yaml  # Debian's python3-yaml
        with open(path) as f:
            spec = yaml.safe_load(f)
        if not isinstance(spec, dict):
            fail(f"{path}: not a YAML mapping")
        unknown = set(spec) - self.FIELDS
        if unknown:
            fail(f"{path}: unknown fields {sorted(unknown)} (known: {sorted(self.FIELDS)})")
        self.name = spec.get("name") or pathlib.Path(path).stem
        self.fabric = spec.get("fabric", "shm")
        if self.fabric not in ("shm", "verbs"):
            fail(f"{path}: fabric must be shm or verbs")
        self.build = spec.get("build", "opt")
        if self.build not in ("opt", "portable_opt", "default"):
            fail(f"{path}: build must be opt, portable_opt or default")
        try:
            self.hosts = [exp_hosts.Host(h, REPO) for h in spec.get("hosts") or []]
        except exp_hosts.HostError as error:
            fail(f"{path}: {error}")
        names = [h.name for h in self.hosts]
        if len(set(names)) != len(names):
            fail(f"{path}: host names must be unique ({names})")
        servers = [h for h in self.hosts if h.role == "server"]
        self.clients = [h for h in self.hosts if h.role == "client"]
        if len(servers) != 1 or not self.clients:
            fail(f"{path}: needs exactly one server host and at least one client host")
        self.server = servers[0]
        # Where a point's `replicas` backups run (in turn; none: beside the server) and its
        # ZooKeeper (`coordinated`; none: on this machine).
        self.backup_hosts = [h for h in self.hosts if h.role == "backup"]
        coordinators = [h for h in self.hosts if h.role == "coordinator"]
        if len(coordinators) > 1:
            fail(f"{path}: at most one coordinator host")
        self.coordinator = coordinators[0] if coordinators else None
        if self.fabric == "shm" and not all(h.loopback for h in self.hosts):
            fail(f"{path}: the shm fabric connects processes of ONE machine: all hosts local")
        self.path = path
        self.fixed = {"server": dict(spec.get("server") or {}),
                      "client": dict(spec.get("client") or {})}
        self.sweep = {k: list(v) if isinstance(v, list) else [v]
                      for k, v in (spec.get("sweep") or {}).items()}
        for override in overrides:
            axis, _, values = override.partition("=")
            if not values:
                fail(f"--sweep {override}: write AXIS=V1,V2")
            self.sweep[axis] = [yaml.safe_load(v) for v in values.split(",")]
        self.repetitions = int(spec.get("repetitions", 1))
        self.knobs = None  # check_knobs, once the binaries are built

    def check_knobs(self, knobs):
        """Every fixed knob and sweep axis must be a flag of the binary it is given to."""
        for role, fixed in self.fixed.items():
            for knob in fixed:
                if knobs.role(knob)[0] not in (role, "both", "runner"):
                    fail(f"{self.path}: '{knob}' is not a {role} knob")
        for axis in self.sweep:
            knobs.role(axis)
        for system in self.systems():
            if system not in SYSTEMS:
                fail(f"{self.path}: system '{system}' (known: {', '.join(SYSTEMS)})")
        failover = {str(v).lower() for v in self.values_of("failover")}
        if "true" in failover and ("true" not in {str(v).lower() for v in
                                                  self.values_of("coordinated")} or
                                   not any(int(v) > 0 for v in self.values_of("replicas"))):
            fail(f"{self.path}: failover needs coordinated replicas (replicas >= 1, coordinated: "
                 f"true): a backup takes over only in a coordinated cluster")
        if "true" in failover:
            workloads = {str(w) for w in self.values_of("workload")} or {"C"}
            if not workloads <= set(FAILOVER_WORKLOADS):
                fail(f"{self.path}: failover checks that preloaded keys survive: workload must be "
                     f"one of {', '.join(FAILOVER_WORKLOADS)} (no DELETEs), not "
                     f"{sorted(workloads - set(FAILOVER_WORKLOADS))}")
        if "hopscotch" in self.systems():
            remote = [h.name for h in self.hosts if not h.local]
            if remote:
                fail(f"{self.path}: system hopscotch runs on local hosts only (its trace and "
                     f"table are made on this machine); remote: {remote}")
            workloads = {str(w) for w in self.values_of("workload")} or {"C"}
            if workloads != {"C"}:
                fail(f"{self.path}: system hopscotch does GETs only: workload must be C, not "
                     f"{sorted(workloads - {'C'})}")
        self.knobs = knobs

    def values_of(self, knob):
        """Every value a knob takes in this experiment (fixed or swept); empty if never given."""
        values = list(self.sweep.get(knob, []))
        for fixed in self.fixed.values():
            if knob in fixed and knob not in self.sweep:
                values.append(fixed[knob])
        return values

    def systems(self):
        return {str(v) for v in self.values_of("system")} or {"herd"}

    def points(self):
        axes = list(self.sweep)
        for values in itertools.product(*(self.sweep[a] for a in axes)):
            for repetition in range(self.repetitions):
                yield dict(zip(axes, values)), repetition

    def title(self):
        fixed = {**self.fixed["server"], **self.fixed["client"]}
        text = ", ".join(f"{k}={v}" for k, v in fixed.items())
        return f"{self.name} ({self.fabric}): {text}"


def point_id(point, repetition):
    parts = [f"{axis}-{value}" for axis, value in point.items()]
    return "_".join(parts + [f"r{repetition}"])


def flags(knobs):
    out = []
    for name, value in knobs.items():
        name = ALIASES.get(name, name)
        if isinstance(value, bool):
            value = "true" if value else "false"
        out.append(f"--{name}={value}")
    return out


# ------------------------------------------------------------------------------ processes
class Processes:
    """Everything this run started; stopped on any exit path (Ctrl-C included)."""

    def __init__(self):
        self.live = []
        # Every process this run starts, here or on a host, carries it in its environment
        # (exp_hosts.leftovers finds what is left of the run by it).
        self.run_id = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"

    def start(self, host, argv, stdout, stderr):
        if host.local:
            command = argv
        else:
            # The remote command dies with the ssh session: when ssh goes away its stdin closes,
            # the watchdog's read loop ends and it kills the process (SIGTERM); a line KILL on
            # its stdin kills it at once (SIGKILL: a crash, for failovers).
            inner = " ".join(shlex.quote(a) for a in argv)
            # (A background job's stdin is /dev/null, hence the copy of ssh's stdin on fd 3.)
            # Its pid there comes back first, for samples of its CPU (cpu_sample).
            script = (f"cd {shlex.quote(host.repo)} && export {exp_hosts.MARKER}={self.run_id} "
                      f"&& exec 3<&0 && {{ {inner} & child=$!; echo \"{REMOTE_PID_LINE}$child\"; "
                      f"(while read -r line <&3; do [ \"$line\" = KILL ] && kill -KILL $child; "
                      f"done; kill -TERM $child) >/dev/null 2>&1 & watchdog=$!; "
                      f"wait $child; status=$?; kill $watchdog 2>/dev/null; exit $status; }}")
            command = host.ssh_prefix() + ["bash", "-c", shlex.quote(script)]
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr,
                                   start_new_session=True, cwd=REPO,
                                   env={**os.environ, exp_hosts.MARKER: self.run_id})
        process.remote = not host.local
        self.live.append(process)
        return process

    def crash(self, process):
        """SIGKILL, here or on its host (no chance to print or clean up), and waits for it."""
        if process.poll() is None:
            if process.remote:
                try:
                    process.stdin.write(b"KILL\n")
                    process.stdin.flush()
                except (BrokenPipeError, ValueError):
                    pass
            else:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.stop(process, SERVER_STOP_TIMEOUT_S)

    def stop(self, process, timeout):
        """SIGTERM (a remote process: through its watchdog, so its last output still comes back
        over ssh), then SIGKILL after `timeout` seconds."""
        if process.poll() is None:
            if process.remote:
                process.stdin.close()
            else:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if not process.stdin.closed:
            process.stdin.close()
        if process in self.live:
            self.live.remove(process)

    def stop_all(self):
        for process in list(self.live):
            self.stop(process, timeout=5)


def read_line_until(process, prefix, timeout_s):
    """The first stdout line of `process` that starts with `prefix`, or PointFailed."""
    deadline = time.monotonic() + timeout_s
    buffer = b""
    fd = process.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PointFailed(f"no '{prefix}' line within {timeout_s} s")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            raise PointFailed(f"exited (status {process.wait()}) before printing '{prefix}'")
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            text = line.decode(errors="replace")
            if text.startswith(REMOTE_PID_LINE):
                process.remote_pid = int(text[len(REMOTE_PID_LINE):])
            if text.startswith(prefix):
                return text


def read_to_end(process, timeout_s):
    """All of `process`'s stdout once it exits. Its stdin stays open meanwhile: closing it is
    how a remote process is told to stop (see Processes.start)."""
    deadline = time.monotonic() + timeout_s
    chunks = []
    fd = process.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise PointFailed(f"ran past {timeout_s:.0f} s")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    process.wait(timeout=max(deadline - time.monotonic(), 1))
    return b"".join(chunks)


def read_all_to_end(named, timeout_s):
    """The stdout of each of `named` ((name, process, log) triples) once it exits, read side by
    side: the first one to exit with a non-zero status fails the lot at once (PointFailed naming
    it), without waiting for the others. Each log is closed as its process ends."""
    deadline = time.monotonic() + timeout_s
    pending = {process.stdout.fileno(): (name, process, log, []) for name, process, log in named}
    outputs = {}
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            names = ", ".join(name for name, _, _, _ in pending.values())
            raise PointFailed(f"client on {names}: ran past {timeout_s:.0f} s")
        ready, _, _ = select.select(list(pending), [], [], left)
        for fd in ready:
            chunk = os.read(fd, 65536)
            name, process, log, chunks = pending[fd]
            if chunk:
                chunks.append(chunk)
                continue
            del pending[fd]
            log.close()
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                raise PointFailed(f"client on {name}: closed its output but did not exit")
            if process.returncode != 0:
                raise PointFailed(f"client on {name} exited {process.returncode}")
            outputs[name] = b"".join(chunks)
    return outputs


def last_json_line(text, what):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError as error:
                raise PointFailed(f"{what}: unreadable JSON ({error})")
    raise PointFailed(f"{what}: printed no JSON result")


# ------------------------------------------------------------------------------ one point
class Runner:
    def __init__(self, experiment, out_dir, processes):
        self.x = experiment
        self.out = out_dir
        self.logs = out_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.processes = processes
        self.bin = bazel_bin(experiment.build)

    def fabric_flags(self, host, point_name):
        if self.x.fabric == "shm":
            # A fabric name per run and point: concurrent runs never see each other.
            return ["--fabric=shm", f"--shm_fabric_name=exp-{os.getpid()}-{point_name}"]
        out = ["--fabric=verbs"]
        if host.device:
            out.append(f"--device={host.device}")
        if host.gid_index is not None:
            out.append(f"--gid_index={host.gid_index}")
        return out

    def system_of(self, point):
        """The point's `system` (runner knob), None where the experiment names none."""
        return point.get("system", self.x.fixed["client"].get(
            "system", self.x.fixed["server"].get("system")))

    def merged(self, point):
        """Every knob of the point: the fixed ones, its system's (SYSTEMS), its axes' values."""
        bundle = SYSTEMS.get(self.system_of(point)) or {}
        return {**self.x.fixed["server"], **self.x.fixed["client"], **bundle, **point}

    def knobs_for(self, role, point):
        """The flags of `role`'s binary: its fixed knobs, fabric knobs fixed for either side, its
        system's, and the point's values of the axes that belong to it."""
        return {k: v for k, v in self.merged(point).items()
                if self.x.knobs.role(k)[0] in (role, "both")}

    def run_point(self, point, repetition, name, attempt=1):
        # A retry's logs go beside the failed attempt's, which say why it failed.
        log_name = name if attempt == 1 else f"{name}.attempt{attempt}"
        system = self.system_of(point)
        if system == "hopscotch":
            return self.run_hop_point(point, repetition, name, log_name)
        record = self.run_herd_point(point, repetition, name, log_name)
        if system is not None:
            record["system"] = system
        return record

    def server_argv(self, host, name, server_knobs, coordinated):
        """herd_server's argv on `host`: its fabric flags, the point's knobs, where it listens
        and (coordinated) the address its registration names."""
        argv = [str(self.bin / "herd" / "herd_server"), "--port=0"]
        argv += self.fabric_flags(host, name) + flags(server_knobs)
        if host.listen_address:
            argv.append(f"--listen_address={host.listen_address}")
        if coordinated:
            argv.append(f"--advertise_host={host.reach_address()}")
        return argv

    def start_coordinator(self, log_name):
        """A private ZooKeeper for the point (scripts/zk.sh), on the coordinator host if the
        experiment has one, else here; returns its HOST:PORT."""
        host = self.x.coordinator
        if host is None:
            self.zk_dir = str(self.logs / f"{log_name}.zk")
            shutil.rmtree(self.zk_dir, ignore_errors=True)  # a rerun's point starts a new cluster
            command = [str(REPO / "scripts" / "zk.sh"), "start", self.zk_dir]
            zk = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                check=False, env={**os.environ,
                                                  exp_hosts.MARKER: self.processes.run_id})
            status, out, err = zk.returncode, zk.stdout.decode(), zk.stderr.decode()
        else:
            # Its own folder there (a host's /tmp), gone once the point's cluster is stopped.
            self.zk_dir = f"/tmp/herd-exp-{self.processes.run_id}-{log_name}.zk"
            status, out, err = host.run(
                f"rm -rf {shlex.quote(self.zk_dir)} && export "
                f"{exp_hosts.MARKER}={self.processes.run_id} "
                f"HERD_ZK_ADDRESS={shlex.quote(host.address)} && "
                f"scripts/zk.sh start {shlex.quote(self.zk_dir)}")
        if status != 0:
            where = f" on {host.name}" if host else ""
            raise PointFailed(f"zk.sh start{where}: {err.strip() or f'exit status {status}'}")
        return out.strip().splitlines()[-1]

    def stop_coordinator(self):
        host = self.x.coordinator
        if host is None:
            subprocess.run([str(REPO / "scripts" / "zk.sh"), "stop", self.zk_dir], check=False)
        else:
            host.run(f"scripts/zk.sh stop {shlex.quote(self.zk_dir)}; "
                     f"rm -rf {shlex.quote(self.zk_dir)}")
        self.zk_dir = None

    def run_herd_point(self, point, repetition, name, log_name):
        server_knobs = self.knobs_for("server", point)
        client_knobs = self.knobs_for("client", point)
        merged = {**self.x.fixed["server"], **point}
        replicas = int(merged.get("replicas", 0))
        coordinated = replicas > 0 and str(merged.get("coordinated", "false")).lower() == "true"
        failover = str(self.merged(point).get("failover", "false")).lower() == "true"
        if failover and not coordinated:
            raise PointFailed("failover needs coordinated replicas (replicas >= 1, coordinated: "
                              "true): a backup takes over only in a coordinated cluster")
        self.zk_dir = None
        self.awaited_backups = replicas if coordinated else 0
        self.coordinator_address = None
        server_argv = self.server_argv(self.x.server, name, server_knobs, coordinated)
        backups = []
        try:
            if coordinated:
                self.coordinator_address = self.start_coordinator(log_name)
                server_argv += [f"--coordinator={self.coordinator_address}", "--cluster=exp"]
            backups = (self.start_backups(name, server_knobs, replicas, log_name, coordinated)
                       if replicas else [])
            if backups and coordinated:
                # A primary fenced during a point (a stall past its session) is a failed point:
                # not a backup whose totals would be taken for the primary's.
                server_argv += ["--role=primary", "--member=primary", "--rejoin_when_fenced=false"]
                self.backup_clients = ",".join(b[2] for b in backups)
            elif backups:
                server_argv += ["--role=primary",
                                "--backups=" + ",".join(b[1] for b in backups)]
                self.backup_clients = ",".join(b[2] for b in backups)
            else:
                self.backup_clients = ""
            if self.x.server.cores is not None and "worker_cores" not in server_knobs:
                server_argv.append(f"--worker_cores={self.x.server.cores}")
            return self.run_primary(point, repetition, name, log_name, server_argv, server_knobs,
                                    client_knobs, backups if failover else None)
        finally:
            for process, _, _, _ in backups:
                self.processes.stop(process, SERVER_STOP_TIMEOUT_S)
            if self.zk_dir is not None:
                self.stop_coordinator()

    def stats_of(self, address):
        """herd_admin stats of the server at `address` (HOST:PORT), {} if it does not answer."""
        admin = str(self.bin / "herd" / "herd_admin")
        done = subprocess.run([admin, "stats", address], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, check=False)
        try:
            return json.loads(done.stdout)["stats"]
        except (ValueError, KeyError, TypeError):
            return {}

    def await_backups(self, address, count, log_name):
        """A coordinated primary's backups join by state transfer after it starts: waits until
        its stats count `count` backups in its configuration, all live."""
        deadline = time.time() + COORDINATED_SYNC_TIMEOUT_S
        while time.time() < deadline:
            replication = self.stats_of(address).get("replication", {})
            if (replication.get("backups") == count and
                    replication.get("live_backups") == count):
                return
            time.sleep(0.1)
        raise PointFailed(f"the coordinated primary never had {count} backups in sync "
                          f"(see logs/{log_name}.*.log)")

    def start_backups(self, name, server_knobs, replicas, log_name, coordinated=False):
        """`replicas` backups with the server's knobs, on the backup hosts in turn (none: beside
        the server), unpinned (their workers only serve the primary's WRITEs and the GETs sent to
        them); returns (process, replication address, client address, host) of each."""
        backups = []
        for index in range(replicas):
            host = (self.x.backup_hosts[index % len(self.x.backup_hosts)]
                    if self.x.backup_hosts else self.x.server)
            argv = self.server_argv(host, name, server_knobs, coordinated)
            argv += ["--role=backup", "--replication_port=0", "--pin_workers=false"]
            if coordinated:
                argv += [f"--coordinator={self.coordinator_address}", "--cluster=exp",
                         f"--member=backup{index}"]
            log = open(self.logs / f"{log_name}.backup{index}.log", "wb")
            process = self.processes.start(host, argv, subprocess.PIPE, log)
            backups.append((process, None, None, host))
            try:
                ready = read_line_until(process, "herd_server ready", SERVER_READY_TIMEOUT_S)
            except PointFailed as error:
                for p, _, _, _ in backups:
                    self.processes.stop(p, SERVER_STOP_TIMEOUT_S)
                raise PointFailed(f"backup {index} on {host.name}: {error} "
                                  f"(see logs/{log_name}.backup{index}.log)")
            replication_port = ready.split("replication_port=", 1)[1].split()[0]
            client_port = ready.split("port=", 1)[1].split()[0]
            address = host.reach_address()
            backups[-1] = (process, f"{address}:{replication_port}", f"{address}:{client_port}",
                           host)
        return backups

    def start_server(self, argv, server_log, log_name, binary):
        """Starts `binary` (herd_server or hop_server) on the server host and waits for its
        readiness line; (process, the port it printed). Stops it if it never gets ready."""
        server = self.processes.start(self.x.server, argv, subprocess.PIPE, server_log)
        try:
            ready = read_line_until(server, f"{binary} ready", SERVER_READY_TIMEOUT_S)
        except PointFailed as error:
            self.processes.stop(server, SERVER_STOP_TIMEOUT_S)
            raise PointFailed(f"server on {self.x.server.name}: {error} "
                              f"(see logs/{log_name}.server.log)")
        return server, ready.split("port=", 1)[1].split()[0]

    def client_argvs(self, name, client_knobs, server_flags):
        """herd_client's argv on each client host, after `server_flags` (where it goes)."""
        argvs = []
        for host in self.x.clients:
            argv = [str(self.bin / "bench" / "herd_client")] + server_flags
            argv += self.fabric_flags(host, name) + flags(client_knobs)
            if host.cores is not None and "client_cores" not in client_knobs:
                argv.append(f"--client_cores={host.cores}")
            argvs.append(argv)
        return argvs

    def run_primary(self, point, repetition, name, log_name, server_argv, server_knobs,
                    client_knobs, failover_backups=None):
        with open(self.logs / f"{log_name}.server.log", "wb") as server_log:
            server, port = self.start_server(server_argv, server_log, log_name, "herd_server")
            address = self.x.server.reach_address()
            if getattr(self, "awaited_backups", 0):
                try:
                    self.await_backups(f"{address}:{port}", self.awaited_backups, log_name)
                except PointFailed:
                    self.processes.stop(server, SERVER_STOP_TIMEOUT_S)
                    raise
            budget = (float(client_knobs.get("warmup_s", 1)) +
                      float(client_knobs.get("duration_s", 5)) + CLIENT_SLACK_S)
            self.primary_address = f"{address}:{port}"
            server_flags = [f"--server={address}:{port}"]
            if self.backup_clients:
                server_flags.append(f"--backups={self.backup_clients}")
            argvs = self.client_argvs(name, client_knobs, server_flags)
            results, cpu = self.run_clients(server, argvs, budget, log_name,
                                            crash_server=failover_backups is not None)
            server_result = ({"server": self.crashed_stats} if failover_backups is not None
                             else last_json_line(server.stdout.read().decode(errors="replace"),
                                                 "server"))
        record = summarize(self.x, point, repetition, server_knobs, client_knobs, results,
                           server_result)
        record.update(server_cpu_fields(cpu[0], cpu[1], record["mops"]))
        # The server's WRs and bytes per request it answered over its life (its JSON gives its
        # Mops since it started, not a count: times its life as seen here).
        record.update(server_per_op(record["server"], record["server"].get("mops", 0) * 1e6 *
                                    (cpu[2] - cpu[0][0])))
        record.update(per_op_totals(record))
        if failover_backups is not None:
            record["failover"] = self.after_failover(name, log_name, client_knobs, budget,
                                                     failover_backups, cpu[2])
        # This machine's 1-minute load average as the point ended: on a shared machine, what
        # else ran (a local shm point's own server and client thread already count ~2).
        record["loadavg_1m"] = round(os.getloadavg()[0], 2)
        return record

    def after_failover(self, name, log_name, client_knobs, budget, backups, killed_at):
        """The primary was just killed (SIGKILL at `killed_at`, this machine's clock): waits
        for a backup to take over, then runs the clients again at the new primary (found in
        the coordinator), without preloading: every GET of a key the first run preloaded (each
        PUT acknowledged, so at every backup) must find it."""
        deadline = killed_at + FAILOVER_TIMEOUT_S
        new_primary = None
        while new_primary is None and time.monotonic() < deadline:
            for process, _, client_address, host in backups:
                replication = self.stats_of(client_address).get("replication", {})
                if replication.get("role") == "primary":
                    new_primary = (process, host)
                    break
            else:
                time.sleep(0.05)
        if new_primary is None:
            raise PointFailed(f"no backup took over within {FAILOVER_TIMEOUT_S} s of the "
                              f"primary's kill (see logs/{log_name}.backup*.log)")
        took_over_ms = (time.monotonic() - killed_at) * 1000
        knobs = {**client_knobs, "preload": False}
        argvs = self.client_argvs(name, knobs, [f"--coordinator={self.coordinator_address}",
                                                "--cluster=exp"])
        results, _ = self.run_clients(new_primary[0], argvs, budget, f"{log_name}.after",
                                      stop_server=False, server_host=new_primary[1])
        gets = sum(c.get("gets", 0) for c in results)
        misses = sum(c.get("get_misses", 0) for c in results)
        if misses:
            raise PointFailed(f"after the failover to {new_primary[1].name}, {misses} of {gets} "
                              f"GETs missed keys preloaded (acknowledged) before it")
        return {"new_primary": new_primary[1].name, "took_over_ms": round(took_over_ms, 1),
                "mops_after": round(sum(c["mops"] for c in results), 4), "gets_after": gets,
                "get_misses_after": misses,
                "p99_us_after": max(c.get("p99_us", 0) for c in results)}

    def run_clients(self, server, argvs, budget, log_name, crash_server=False, stop_server=True,
                    server_host=None):
        """Runs argvs[i] on client host i, collects each one's JSON line, stops them and the
        server (which prints its totals as its last line when stopped; `crash_server`: SIGKILL
        instead, a failover's crash; not `stop_server`: left running). Returns the results and
        (server CPU sample as the clients started, as they exited, when the server was told to
        stop). `server_host`: where `server` runs (default the server host)."""
        server_host = server_host or self.x.server
        cpu_before = cpu_sample(server, server_host)
        clients = []
        for index, (host, argv) in enumerate(zip(self.x.clients, argvs)):
            log = open(self.logs / f"{log_name}.client{index}.log", "wb")
            clients.append((host, self.processes.start(host, argv, subprocess.PIPE, log), log))
        results, stopped_at = [], None
        try:
            try:
                outputs = read_all_to_end([(h.name, p, log) for h, p, log in clients], budget)
            except PointFailed as error:
                raise PointFailed(f"{error} (see logs/{log_name}.client*.log)")
            for host, _, _ in clients:
                results.append(last_json_line(outputs[host.name].decode(errors="replace"),
                                              f"client on {host.name}"))
            cpu_after = cpu_sample(server, server_host)
        finally:
            for _, process, log in clients:
                self.processes.stop(process, timeout=5)
                log.close()
            stopped_at = time.monotonic()  # the server's life ends (its totals' time, roughly)
            if crash_server:
                # Its counters as it dies (a crash prints no totals), then the crash.
                self.crashed_stats = self.stats_of(self.primary_address)
                stopped_at = time.monotonic()
                self.processes.crash(server)
            elif stop_server:
                self.processes.stop(server, SERVER_STOP_TIMEOUT_S)
        return results, (cpu_before, cpu_after, stopped_at)

    # -------------------------------------------------------------------------- hopscotch
    def hop_files(self, setup):
        """The trace and table of `setup` (hop_trace_setup), made once per results directory:
        (trace path, table path, what ycsb_trace and hop_build printed)."""
        directory = (self.out / "hopscotch").resolve()
        stem = (f"ycsb-{setup['records']}-{setup['operations']}-{setup['distribution']}-"
                f"seed{setup['seed']}")
        trace, table = directory / f"{stem}.txt", directory / f"{stem}.hop"
        summary_path = directory / f"{stem}.json"
        if summary_path.exists():
            return trace, table, json.loads(summary_path.read_text())
        directory.mkdir(parents=True, exist_ok=True)
        summary = {}
        trace_argv, build_argv = hop_prepare_argvs(REPO / self.bin, setup, trace, table)
        with open(self.logs / "hopscotch.prepare.log", "ab") as log:
            for what, argv in (("trace", trace_argv), ("table", build_argv)):
                log.write(f"$ {' '.join(argv)}\n".encode())
                log.flush()
                done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=log, cwd=REPO,
                                      timeout=HOP_PREPARE_TIMEOUT_S)
                log.write(done.stdout)
                if done.returncode != 0:
                    raise PointFailed(f"making the hopscotch {what} failed (exit "
                                      f"{done.returncode}; see logs/hopscotch.prepare.log)")
                summary[what] = last_json_line(done.stdout.decode(errors="replace"), what)
        for path in (trace, table):  # written under .tmp names: whole or absent
            path.with_name(path.name + ".tmp").rename(path)
        temporary = summary_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(summary) + "\n")
        temporary.rename(summary_path)
        return trace, table, summary

    def run_hop_point(self, point, repetition, name, log_name):
        """One point of one-sided lookups: hop_server serving the table, hop_client(s) READing
        it with as many lookups in flight as herd's clients would have requests."""
        knobs, merged = self.x.knobs, self.merged(point)
        trace, table, made = self.hop_files(hop_trace_setup(knobs, merged))
        client_flags = hop_client_flags(knobs, merged)
        # The transport's own knobs (the fabric's, both sides') reach the hop binaries too.
        transport = flags({k: v for k, v in merged.items() if knobs.role(k)[0] == "both"})
        server_argv = hop_server_argv(self.bin, table,
                                      self.fabric_flags(self.x.server, name) + transport)
        with open(self.logs / f"{log_name}.server.log", "wb") as server_log:
            server, port = self.start_server(server_argv, server_log, log_name, "hop_server")
            argvs = [hop_client_argv(self.bin, f"127.0.0.1:{port}", trace,
                                     self.fabric_flags(host, name) + transport, client_flags)
                     for host in self.x.clients]
            budget = float(client_flags["duration_s"]) + CLIENT_SLACK_S
            results, cpu = self.run_clients(server, argvs, budget, log_name)
            server_result = last_json_line(server.stdout.read().decode(errors="replace"),
                                           "server")
        record = summarize_hop(self.x, point, repetition, self.knobs_for("server", point),
                               self.knobs_for("client", point), results, server_result)
        record["hop_flags"] = {"server": server_argv[1:], "client": client_flags}
        record["table"] = made
        record.update(server_cpu_fields(cpu[0], cpu[1], record["mops"]))
        record.update(per_op_totals(record))
        record["loadavg_1m"] = round(os.getloadavg()[0], 2)
        return record


def client_value_bytes(client):
    """The value size a client process ran with (its JSON's workload; hopscotch's are fixed)."""
    if client.get("system") == "hopscotch":
        return HOP_VALUE_BYTES
    return (client.get("workload") or {}).get("value_bytes", 0)


# ------------------------------------------------------------------------------ server CPU
def proc_stat_cpu_seconds(text, ticks_per_s):
    """utime + stime (fields 14 and 15) of a /proc/PID/stat line, in seconds: the process's
    threads together. Fields are counted after the command name's last ')' (the name, field 2,
    may hold spaces and parentheses)."""
    fields = text[text.rindex(")") + 1:].split()  # fields[0] is field 3, the state
    return (int(fields[11]) + int(fields[12])) / ticks_per_s


def cpu_sample(process, host):
    """(now, the process's CPU seconds so far): from this machine's /proc, or for a process on
    another host from its /proc over ssh (its pid as Processes.start reported it; `now` is the
    middle of the ssh call). The seconds are None where the process is gone or its pid unknown."""
    now = time.monotonic()
    if not host.local:
        pid = getattr(process, "remote_pid", None)
        if pid is None:
            return now, None
        status, out, _ = host.run(f"getconf CLK_TCK && cat /proc/{int(pid)}/stat")
        now = (now + time.monotonic()) / 2
        try:
            ticks, stat = out.split("\n", 1)
            return now, (proc_stat_cpu_seconds(stat, int(ticks)) if status == 0 else None)
        except ValueError:
            return now, None
    try:
        text = pathlib.Path(f"/proc/{process.pid}/stat").read_text()
        return now, proc_stat_cpu_seconds(text, os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return now, None


def server_cpu_fields(before, after, mops):
    """The server's CPU between two cpu_samples: cores busy, and per operation at the clients'
    measured rate (cores / Mops = us per operation): the per-GET cost where the CPU's rate holds
    through the clients' run, as a busy-polling worker's (one core) or an idle server's (none)."""
    (t0, cpu0), (t1, cpu1) = before, after
    if cpu0 is None or cpu1 is None or t1 <= t0:
        return {"server_cpu_s": None, "server_cores": None, "server_cpu_us_per_op": None}
    cores = (cpu1 - cpu0) / (t1 - t0)
    return {"server_cpu_s": round(cpu1 - cpu0, 3), "server_cores": round(cores, 3),
            "server_cpu_us_per_op": round(cores / mops, 4) if mops > 0 else None}


def server_per_op(server, operations):
    """The server's own fabric WRs and payload bytes per operation it served (`operations`)."""
    fabric = server.get("fabric") or {}
    if operations <= 0 or "wrs" not in fabric:
        return {"server_wrs_per_op": None, "server_bytes_per_op": None}
    return {"server_wrs_per_op": round(fabric["wrs"] / operations, 3),
            "server_bytes_per_op": round(fabric.get("bytes", 0) / operations, 1)}


def per_op_totals(record):
    """Both sides' WRs and payload bytes per operation (None where a side is unknown)."""
    def total(client_field, server_field, digits):
        a, b = record.get(client_field), record.get(server_field)
        return None if a is None or b is None else round(a + b, digits)

    return {"total_wrs_per_op": total("wrs_per_op", "server_wrs_per_op", 3),
            "wire_bytes_per_op": total("payload_bytes_per_op", "server_bytes_per_op", 1)}


# ------------------------------------------------------------------------------ hopscotch
def hop_trace_setup(knobs, merged):
    """The YCSB trace a hopscotch point replays, from the herd client's workload knobs: as many
    records as herd's `keys` (and as many READs), the same key distribution and seed."""
    distribution = str(knobs.value("distribution", merged))
    traced = {"uniform": "uniform", "zipf": "zipfian"}.get(distribution)
    if traced is None:
        fail(f"system hopscotch: distribution '{distribution}' has no ycsb_trace equivalent")
    keys = int(knobs.value("keys", merged))
    return {"records": keys, "operations": keys, "distribution": traced,
            "seed": int(knobs.value("seed", merged))}


def hop_client_flags(knobs, merged):
    """hop_client's flags for a point: herd's client threads, and per thread as many lookups in
    flight as herd's logical clients can have requests outstanding (clients per thread x window
    per worker x workers); the same measured duration."""
    outstanding = (int(knobs.value("clients_per_thread", merged)) *
                   int(knobs.value("window", merged)) * int(knobs.value("workers", merged)))
    return {"threads": int(knobs.value("threads", merged)), "window": outstanding,
            "duration_s": knobs.value("duration_s", merged)}


def hop_prepare_argvs(bin_dir, setup, trace, table):
    """The commands that write the trace and build its table (under .tmp names)."""
    trace_argv = [str(bin_dir / "bench" / "ycsb_trace"), f"--records={setup['records']}",
                  f"--operations={setup['operations']}",
                  f"--distribution={setup['distribution']}", "--read_proportion=1",
                  "--update_proportion=0", "--insert_proportion=0", f"--seed={setup['seed']}",
                  f"--out={trace}.tmp"]
    build_argv = [str(bin_dir / "hopscotch" / "hop_build"), f"--trace={trace}.tmp",
                  f"--out={table}.tmp"]
    return trace_argv, build_argv


def hop_server_argv(bin_dir, table, extra):
    """hop_server serving `table` read-only (nothing upserts; the file stays as built)."""
    return [str(bin_dir / "hopscotch" / "hop_server"), f"--table={table}", "--port=0",
            "--read_only"] + list(extra)


def hop_client_argv(bin_dir, servers, trace, extra, client_flags):
    return ([str(bin_dir / "bench" / "hop_client"), f"--servers={servers}", f"--trace={trace}"]
            + list(extra) + flags(client_flags))


def summarize_hop(x, point, repetition, server_knobs, client_knobs, clients, server):
    """A hopscotch point's record, with the fields a herd point's has (per lookup = per GET).
    server_knobs/client_knobs: the experiment's knobs as herd would have had them."""
    lookups = max(sum(c.get("lookups", 0) for c in clients), 1)

    def per_lookup(total):
        return round(total / lookups, 3)

    misses = sum(c.get("misses", 0) for c in clients)
    fabric = server.get("fabric") or {}
    return {
        "experiment": x.name, "fabric": x.fabric, "point": point, "repetition": repetition,
        "system": "hopscotch", "server_knobs": server_knobs, "client_knobs": client_knobs,
        "mops": round(sum(c["mops"] for c in clients), 4),
        "p50_us": max(c.get("p50_us", 0) for c in clients),
        "p99_us": max(c.get("p99_us", 0) for c in clients), "p999_us": None,
        "retransmissions": 0,  # RC: the NIC's business
        # The clients' WRs (READs, re-reads of torn snapshots, miss confirmations) and the bytes
        # they moved, per lookup; a round trip per READ (`reads` counts the re-reads and
        # confirmations too; each waits for the READ before it).
        "wrs_per_op": per_lookup(sum((c.get("fabric") or {}).get("wrs", 0) for c in clients)),
        "payload_bytes_per_op": round(sum((c.get("fabric") or {}).get("bytes", 0)
                                          for c in clients) / lookups, 1),
        "round_trips_per_op": per_lookup(sum(c.get("reads", 0) for c in clients)),
        "value_mb_s": round(sum(c["mops"] for c in clients) * HOP_VALUE_BYTES, 3),
        "get_misses": misses, "get_miss_ratio": round(misses / lookups, 5), "no_memory": 0,
        "clients": clients, "server": server,
        "server_wrs_per_op": round(fabric.get("wrs", 0) / lookups, 3),
        "server_bytes_per_op": round(fabric.get("bytes", 0) / lookups, 1),
        "server_responses_per_doorbell": None, "server_signaled_fraction": None,
        "server_batch": None, "repl_writes_per_op": 0, "repl_bytes_per_op": 0,
        "repl_writes_per_batch": 0,
    }


def per_op(clients, field):
    """`field` (a per-operation figure) over several client processes, weighted by their ops."""
    ops = sum(c.get("ops", 0) for c in clients)
    if not ops:
        return None
    return round(sum(c.get(field, 0) * c.get("ops", 0) for c in clients) / ops, 3)


def summarize(x, point, repetition, server_knobs, client_knobs, clients, server):
    """One point's record: every knob, totals over client processes, the raw results."""
    def worst(field):
        return max(c.get(field, 0) for c in clients)

    record = {
        "experiment": x.name, "fabric": x.fabric, "point": point, "repetition": repetition,
        "server_knobs": server_knobs, "client_knobs": client_knobs,
        "mops": round(sum(c["mops"] for c in clients), 4),
        # Percentiles of the slowest client process (a conservative combination).
        "p50_us": worst("p50_us"), "p99_us": worst("p99_us"), "p999_us": worst("p999_us"),
        "retransmissions": sum(c.get("retransmissions", 0) for c in clients),
        # Per operation over all client processes (each weighted by its ops): fabric WRs the
        # clients posted and the bytes those WRs moved (requests, large PUTs, item READs).
        "wrs_per_op": per_op(clients, "wrs_per_op"),
        "payload_bytes_per_op": per_op(clients, "payload_bytes_per_op"),
        "value_mb_s": round(sum(c["mops"] * client_value_bytes(c) for c in clients), 3),
        # GETs answered NOT_FOUND (every key preloaded: what a cache-mode server forgot, or the
        # workload deleted) and writes refused for room (--store_mode=store at capacity).
        "get_misses": sum(c.get("get_misses", 0) for c in clients),
        "get_miss_ratio": round(sum(c.get("get_misses", 0) for c in clients) /
                                max(sum(c.get("gets", 0) for c in clients), 1), 5),
        "no_memory": sum(c.get("no_memory", 0) for c in clients),
        "clients": clients, "server": server.get("server", server),
    }
    fabric = record["server"].get("fabric", {})
    responses = max(fabric.get("wrs", 0), 1)
    record["server_responses_per_doorbell"] = round(responses / max(fabric.get("doorbells", 0), 1), 2)
    record["server_signaled_fraction"] = round(fabric.get("signaled_wrs", 0) / responses, 4)
    record["server_batch"] = record["server"].get("batch")
    # A primary's replication (--role=primary): WRITE WRs and bytes to the backups per operation
    # the clients completed, and per batch posted.
    replication = record["server"].get("replication") or {}
    ops = max(sum(c.get("ops", 0) for c in clients), 1)
    record["repl_writes_per_op"] = round(replication.get("writes", 0) / ops, 3)
    record["repl_bytes_per_op"] = round(replication.get("bytes", 0) / ops, 1)
    record["repl_writes_per_batch"] = replication.get("writes_per_batch", 0)
    # A request and its response, plus each retransmission and each out-of-line item READ (and
    # re-READ of a torn item).
    record["round_trips_per_op"] = round(1 + sum(
        c.get("retransmissions", 0) + c.get("out_of_line_gets", 0) + c.get("item_rereads", 0)
        for c in clients) / ops, 3)
    return record


CSV_FIELDS = ["mops", "p50_us", "p99_us", "p999_us", "retransmissions", "server_batch",
              "server_responses_per_doorbell", "server_signaled_fraction", "wrs_per_op",
              "payload_bytes_per_op", "value_mb_s", "get_miss_ratio", "no_memory",
              "repl_writes_per_op", "repl_bytes_per_op", "repl_writes_per_batch", "loadavg_1m",
              "server_wrs_per_op", "server_bytes_per_op", "total_wrs_per_op", "wire_bytes_per_op",
              "round_trips_per_op", "server_cores", "server_cpu_us_per_op"]


def write_csv(out_dir, records, axes):
    with open(out_dir / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(axes + ["repetition"] + CSV_FIELDS)
        for r in records:
            writer.writerow([r["point"].get(a) for a in axes] + [r["repetition"]] +
                            [r.get(k) for k in CSV_FIELDS])


def axis_value_key(value):
    """Orders sweep values numerically where they are numbers (1, 2, 4, 16, not 1, 16, 2, 4),
    then by name."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return (1, 0, str(value))
    return (0, value, "")


def with_derived_fields(record):
    """A record with the per-operation fields summarize() derives, computed from its clients'
    results where it was written before they existed."""
    clients = record.get("clients")
    if isinstance(clients, list) and clients:
        record.setdefault("wrs_per_op", per_op(clients, "wrs_per_op"))
        record.setdefault("payload_bytes_per_op", per_op(clients, "payload_bytes_per_op"))
        record.setdefault("value_mb_s", round(sum(c.get("mops", 0) * client_value_bytes(c)
                                                  for c in clients), 3))
    return record


def load_records(out_dir):
    records = []
    for path in sorted(out_dir.glob("*.json")):
        with open(path) as f:
            record = json.load(f)
        if isinstance(record, dict) and "point" in record:
            records.append(with_derived_fields(record))
    # In sweep order: each axis's values numerically, then the repetition.
    records.sort(key=lambda r: ([(a, axis_value_key(v)) for a, v in sorted(r["point"].items())],
                                r.get("repetition", 0)))
    return records


def print_table(records, axes):
    header = " ".join(f"{a:>14}" for a in axes) + f" {'rep':>3} {'Mops':>8} {'p50 us':>8} " \
             f"{'p99 us':>8} {'retx':>6} {'resp/db':>7} {'WRs/op':>7} {'B/op':>10} " \
             f"{'srv us/op':>9}"
    print(header)
    for r in records:
        cells = " ".join(f"{str(r['point'].get(a)):>14}" for a in axes)
        print(f"{cells} {r['repetition']:>3} {r['mops']:>8.3f} {r['p50_us']:>8.2f} "
              f"{r['p99_us']:>8.2f} {r['retransmissions']:>6} "
              f"{str(r.get('server_responses_per_doorbell')):>7} {str(r.get('wrs_per_op')):>7} "
              f"{str(r.get('payload_bytes_per_op')):>10} "
              f"{str(r.get('server_cpu_us_per_op')):>9}")


# ------------------------------------------------------------------------------ grouping
def median(rs, field):
    """The median of `field` over a point's repetitions (NaN where none has it)."""
    values = sorted(r[field] for r in rs if r.get(field) is not None)
    if not values:
        return float("nan")
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def group_records(records):
    """The plots' layout: the x axis (`clients` if swept, else the first axis), the other axes,
    and the records grouped into lines (one per combination of the other axes) then by x value;
    the lines in sweep order."""
    axes = list(records[0]["point"])
    x_axis = "clients" if "clients" in axes else (axes[0] if axes else None)
    others = [a for a in axes if a != x_axis]
    groups = {}
    for r in records:
        key = tuple((a, r["point"][a]) for a in others)
        groups.setdefault(key, {}).setdefault(r["point"].get(x_axis, 0), []).append(r)
    # Lines in sweep order (workload C before A as written, limits numerically).
    order = sorted(groups, key=lambda key: [axis_value_key(v) for _, v in key])
    return x_axis, others, groups, order


def label_of(key):
    """A line's legend: its axes' values; a system by what it is."""
    parts = [SYSTEM_LABELS.get(v, f"system={v}") if a == "system" else f"{a}={v}"
             for a, v in key]
    return ", ".join(parts) or "herd"


def per_get_table(records):
    """Markdown: per line of the plots (series), its cost per operation (per GET in a GET-only
    run) at its highest-throughput point, then its server CPU per GET at every x value."""
    x_axis, _, groups, order = group_records(records)
    first = records[0]

    def cell(value, digits):
        return "n/a" if value is None or value != value else f"{value:.{digits}f}"

    def split(by_x, total, client, server, digits):
        both = (median(by_x, total), median(by_x, client), median(by_x, server))
        if any(v != v for v in both):
            return cell(both[1], digits) + " (client only)"
        return f"{cell(both[0], digits)} ({cell(both[1], digits)} + {cell(both[2], digits)})"

    lines = [f"# Per GET: {first.get('experiment')} ({first.get('fabric')})", "",
             "Each series at its highest-throughput point (median of repetitions). WRs: work "
             "requests posted to send queues, client + server (UD SEND responses also take one "
             "posted RECV at the client each, not counted). Bytes: payload both ways, client + "
             "server, headers not counted. Round trips: herd 1 + retransmissions + out-of-line "
             "item READs; hopscotch one per READ (re-reads and miss confirmations included). "
             "Server CPU: the server process's utime+stime (/proc/PID/stat) over the clients' "
             "run, in cores, and divided by the GET rate.", "",
             f"| series | {x_axis} | Mops | p50 us | p99 us | WRs/GET (client + server) | "
             f"round trips/GET | bytes/GET (client + server) | server CPU us/GET | "
             f"server cores |", "|" + "---|" * 10]
    for key in order:
        by_x = groups[key]
        mops = {x: median(rs, "mops") for x, rs in by_x.items()}
        peak = max(by_x, key=lambda x: mops[x] if mops[x] == mops[x] else -1)  # NaN: last
        rs = by_x[peak]
        lines.append(
            f"| {label_of(key)} | {peak} | {cell(median(rs, 'mops'), 3)} | "
            f"{cell(median(rs, 'p50_us'), 2)} | {cell(median(rs, 'p99_us'), 2)} | "
            f"{split(rs, 'total_wrs_per_op', 'wrs_per_op', 'server_wrs_per_op', 2)} | "
            f"{cell(median(rs, 'round_trips_per_op'), 2)} | "
            f"{split(rs, 'wire_bytes_per_op', 'payload_bytes_per_op', 'server_bytes_per_op', 0)}"
            f" | {cell(median(rs, 'server_cpu_us_per_op'), 3)} | "
            f"{cell(median(rs, 'server_cores'), 2)} |")
    xs = sorted({x for by_x in groups.values() for x in by_x}, key=axis_value_key)
    lines += ["", f"Server CPU us per GET by {x_axis} (a busy-polling server costs a core "
              f"whatever the load: its cost per GET falls as throughput rises):", "",
              "| series | " + " | ".join(str(x) for x in xs) + " |",
              "|" + "---|" * (len(xs) + 1)]
    for key in order:
        by_x = groups[key]
        lines.append(f"| {label_of(key)} | " + " | ".join(
            cell(median(by_x[x], "server_cpu_us_per_op"), 3) if x in by_x else "" for x in xs)
            + " |")
    return "\n".join(lines) + "\n"


def write_per_get_table(out_dir, records):
    if not records:
        return None
    path = out_dir / "per_get.md"
    path.write_text(per_get_table(records))
    return path


# ------------------------------------------------------------------------------ commands
def bazel_bin(build):
    """Where `bazel build --config=BUILD` puts binaries, relative to the checkout (remote hosts
    run them from their own checkout's root). portable_opt has its own directory (.bazelrc)."""
    config_dir = {"default": "k8-fastbuild", "portable_opt": "k8-optportable"}.get(build, "k8-opt")
    return pathlib.Path("bazel-out") / config_dir / "bin"


def build_targets(build, targets):
    config = [] if build == "default" else [f"--config={build}"]
    command = ["bazel", "build"] + config + targets
    print(f"[herd_exp] {' '.join(command)}", file=sys.stderr)
    if subprocess.run(command, cwd=REPO).returncode != 0:
        fail("build failed")


HOP_TARGETS = ["//bench:ycsb_trace", "//hopscotch:hop_build", "//hopscotch:hop_server",
               "//bench:hop_client"]


def build(experiment):
    targets = ["//herd:herd_server", "//bench:herd_client", "//herd:herd_admin"]
    if "hopscotch" in experiment.systems():
        targets += HOP_TARGETS
    build_targets(experiment.build, targets)


def command_run(args):
    experiment = Experiment(args.file, args.sweep)
    if args.build:
        experiment.build = args.build
    if not args.no_build:
        build(experiment)
    experiment.check_knobs(Knobs.from_binaries(REPO / bazel_bin(experiment.build)))
    out_dir = pathlib.Path(args.out) if args.out else REPO / "results" / experiment.name
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        for path in list(out_dir.glob("*.json")) + list(out_dir.glob("*.failed")):
            path.unlink()
    processes = Processes()

    def sweep_leftovers(when):
        """Kills what this run left on any host; True if there was something, or a host could
        not be asked."""
        found, unasked = exp_hosts.leftovers(experiment.hosts, processes.run_id)
        for host, lines in found.items():
            for line in lines:
                print(f"[herd_exp] {when}: left running on {host} (killed): {line}",
                      file=sys.stderr)
        for host, why in unasked.items():
            print(f"[herd_exp] {when}: could not check {host} for leftovers: {why}",
                  file=sys.stderr)
        return bool(found or unasked)

    def interrupted(signum, _frame):
        processes.stop_all()
        sweep_leftovers("stopped")
        print(f"\n[herd_exp] stopped by signal {signum}; rerun to resume", file=sys.stderr)
        sys.exit(130)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    # Every host's checkout, build, device, GID and address, before any point starts.
    binaries = [bazel_bin(experiment.build) / "herd" / "herd_server",
                bazel_bin(experiment.build) / "bench" / "herd_client"]
    try:
        # One ssh connection per host for the whole run, closed on any way out (after the last
        # leftover sweep: atexit runs after the handlers and the finally below).
        connections = exp_hosts.share_connections(experiment.hosts)
        atexit.register(exp_hosts.close_connections, experiment.hosts, connections)
        exp_hosts.check_hosts(experiment.hosts, experiment.fabric, binaries, REPO)
    except exp_hosts.HostError as error:
        fail(str(error))
    runner = Runner(experiment, out_dir, processes)
    failed = []
    points = list(experiment.points())
    try:
        for number, (point, repetition) in enumerate(points, 1):
            name = point_id(point, repetition)
            result_path = out_dir / f"{name}.json"
            if result_path.exists():
                print(f"[herd_exp] {number}/{len(points)} {name}: done before, kept",
                      file=sys.stderr)
                continue
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    record = runner.run_point(point, repetition, name, attempt)
                except PointFailed as error:
                    print(f"[herd_exp] {number}/{len(points)} {name}: attempt {attempt} "
                          f"failed: {error}", file=sys.stderr)
                    processes.stop_all()  # every host clean before the retry or the next point
                    sweep_leftovers(f"{name} attempt {attempt}")
                    if attempt == ATTEMPTS:
                        failed.append(name)
                        (out_dir / f"{name}.failed").write_text(f"{error}\n")
                    continue
                temporary = result_path.with_suffix(".tmp")
                temporary.write_text(json.dumps(record, indent=1) + "\n")
                temporary.rename(result_path)  # a point is either whole or absent
                (out_dir / f"{name}.failed").unlink(missing_ok=True)
                print(f"[herd_exp] {number}/{len(points)} {name}: {record['mops']:.3f} Mops, "
                      f"p50 {record['p50_us']} us, p99 {record['p99_us']} us", file=sys.stderr)
                break
    finally:
        processes.stop_all()
        left_behind = sweep_leftovers("after the run")  # on any way out
    records = load_records(out_dir)
    axes = list(experiment.sweep)
    write_csv(out_dir, records, axes)
    write_per_get_table(out_dir, records)
    print_table(records, axes)
    print(f"[herd_exp] results: {out_dir}/ (results.csv, per_get.md, one JSON per point)",
          file=sys.stderr)
    if failed:
        print(f"[herd_exp] FAILED points: {', '.join(failed)}", file=sys.stderr)
        return 1
    if left_behind:
        print("[herd_exp] FAILED: the run left processes behind, or a host could not be checked "
              "(named above)", file=sys.stderr)
        return 1
    return 0


def size_label(value):
    """A tick label: 16, 256, 1K, 4K, 64K, 1M (exact binary multiples get K, M, G)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return str(value)
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= unit and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def log_x_axis(x_values):
    """Whether an x axis is drawn log2: all values positive numbers spanning more than 4x."""
    numbers = [v for v in x_values if not isinstance(v, bool) and isinstance(v, (int, float))]
    if len(numbers) < 3 or len(numbers) != len(x_values) or min(numbers) <= 0:
        return False
    return max(numbers) / min(numbers) > 4


def command_plot(args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = pathlib.Path(args.dir)
    records = load_records(out_dir)
    if not records:
        fail(f"no results in {out_dir}")
    axes = list(records[0]["point"])
    # Repetitions of a point are combined by their median (this VM's runs swing by 2x).
    x_axis, others, groups, group_order = group_records(records)
    fixed = {**records[0]["server_knobs"], **records[0]["client_knobs"]}
    for axis in axes:
        fixed.pop(ALIASES.get(axis, axis), None)
        fixed.pop(axis, None)
        if axis == "system":  # what the systems set differs between lines: in their labels
            for bundle in SYSTEMS.values():
                for knob in bundle or {}:
                    fixed.pop(knob, None)
    # Wrapped to the figure's width at its font size (about 95 characters of 8-point text on a
    # 7-inch figure), so no knob is cut off at the right.
    title = f"{records[0]['experiment']} ({records[0]['fabric']})\n" + textwrap.fill(
        ", ".join(f"{k}={v}" for k, v in sorted(fixed.items())), width=TITLE_WRAP_CHARS)
    x_values = sorted({r["point"][x_axis] for r in records if x_axis in r["point"]},
                      key=axis_value_key)

    def plot_vs_x(name, panels):
        """One figure against the x axis: a panel per (field, y label, log y), a line per group
        of the other axes (the same colour in every panel). log y None: log when the panel's
        values span more than 30x (Mops from 16 B to 1 MiB values), else linear from 0."""
        figure, plots = plt.subplots(1, len(panels), figsize=(7 if len(panels) == 1 else 10, 4.5),
                                     squeeze=False)
        for (field, ylabel, log_y), axis_plot in zip(panels, plots[0]):
            for key in group_order:
                by_x = groups[key]
                xs = sorted(by_x, key=axis_value_key)
                axis_plot.plot(xs, [median(by_x[x], field) for x in xs], marker="o",
                               label=label_of(key))
            axis_plot.set_xlabel(x_axis or "point")
            axis_plot.set_ylabel(ylabel)
            if log_x_axis(x_values):
                axis_plot.set_xscale("log", base=2)
                # Ticks at the measured values, written as sizes (16, 1K, 1M), not 2^k.
                axis_plot.set_xticks(x_values)
                axis_plot.set_xticklabels([size_label(x) for x in x_values],
                                          fontsize=8 if len(x_values) <= 10 else 7)
                axis_plot.minorticks_off()
            elif all(isinstance(x, (int, float)) for x in x_values):
                axis_plot.set_xticks(x_values)  # the measured points only, not 0.25 of a knob
            values = [median(rs, field) for by_x in groups.values() for rs in by_x.values()]
            values = [v for v in values if v == v and v > 0]  # not NaN, positive
            if log_y is None:
                log_y = bool(values) and max(values) / min(values) > 30
            if log_y:
                axis_plot.set_yscale("log")
            else:
                axis_plot.set_ylim(bottom=0)
            axis_plot.grid(alpha=0.3)
            axis_plot.legend(fontsize=7)
        figure.suptitle(title, fontsize=8)
        figure.tight_layout()
        path = out_dir / name
        figure.savefig(path, dpi=120)
        plt.close(figure)
        return path

    drawn = [plot_vs_x("throughput.png", [("mops", "throughput (Mops)", None)])]
    value_sizes = {client_value_bytes(c) for r in records for c in r.get("clients") or []}
    if len(value_sizes) > 1:
        drawn.append(plot_vs_x("value_mbps.png",
                               [("value_mb_s", "value payload (MB/s = Mops x value_bytes)",
                                 None)]))
    drawn.append(plot_vs_x("latency_vs_x.png", [("p50_us", "p50 latency (us)", True),
                                                ("p99_us", "p99 latency (us)", True)]))

    figure, axis_plot = plt.subplots(figsize=(7, 4.5))
    for key in group_order:
        by_x = groups[key]
        xs = sorted(by_x, key=lambda x: median(by_x[x], "mops"))
        label = label_of(key)
        mops = [median(by_x[x], "mops") for x in xs]
        line, = axis_plot.plot(mops, [median(by_x[x], "p50_us") for x in xs], marker="o",
                               label=f"p50 {label}")
        axis_plot.plot(mops, [median(by_x[x], "p99_us") for x in xs], marker="x", linestyle="--",
                       color=line.get_color(), label=f"p99 {label}")
    axis_plot.set_xlabel("throughput (Mops)")
    axis_plot.set_ylabel("latency (us)")
    axis_plot.set_yscale("log")
    axis_plot.grid(alpha=0.3)
    axis_plot.legend(fontsize=7)
    axis_plot.set_title(title, fontsize=8)
    figure.tight_layout()
    figure.savefig(out_dir / "latency.png", dpi=120)
    plt.close(figure)
    drawn.append(out_dir / "latency.png")
    print(f"[herd_exp] plots: {' '.join(str(p) for p in drawn)}")
    table = write_per_get_table(out_dir, records)
    print(table.read_text(), end="")
    print(f"[herd_exp] table: {table}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run (or resume) an experiment")
    run.add_argument("file")
    run.add_argument("--sweep", action="append", default=[], metavar="AXIS=V1,V2",
                     help="replace or add a sweep axis")
    run.add_argument("--out", help="results directory (default results/<name>)")
    run.add_argument("--no-build", action="store_true", help="use the binaries as built")
    run.add_argument("--build", choices=("opt", "portable_opt", "default"),
                     help="the bazel config of the binaries, instead of the file's `build`")
    run.add_argument("--fresh", action="store_true", help="discard earlier results first")
    plot = commands.add_parser("plot", help="plot a results directory")
    plot.add_argument("dir")
    args = parser.parse_args()
    try:
        return command_run(args) if args.command == "run" else command_plot(args)
    except HerdExpError as error:
        print(f"herd_exp: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
