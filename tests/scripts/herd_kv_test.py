#!/usr/bin/python3
"""End-to-end tests of herd_kv, the command-line client: the real binaries against a real
herd_server on a shm fabric of their own. Round trips (text, binary through --hex, --value_file
and stdin), every failure's exit status and one-line message, stats, usage errors, and a server
nobody runs. Needs the opt binaries (scripts/test.sh builds them first); HERD_BIN=DIR picks
others (e.g. bazel-out/k8-fastbuild/bin). HERD_KV_CM=ADDRESS runs every test over RDMA-CM joins
instead (--connect=cm on $HERD_VERBS_DEVICE, the server listening on ADDRESS, that device's
IPv4 address): scripts/test.sh does so in the Soft-RoCE guest.

usage: tests/scripts/herd_kv_test.py [-v]
"""
import json
import os
import pathlib
import shutil
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
BIN = REPO / os.environ.get("HERD_BIN", "bazel-out/k8-opt/bin")
SERVER = BIN / "herd" / "herd_server"
HERD_KV = BIN / "herd" / "herd_kv"
HERD_CLIENT = BIN / "bench" / "herd_client"
SERVER_READY_TIMEOUT_S = 30
SERVER_STOP_TIMEOUT_S = 10
# One herd_kv run: a join and one request (its own --timeout_ms bounds each).
RUN_TIMEOUT_S = 30
CM_ADDRESS = os.environ.get("HERD_KV_CM", "")
# herd_kv's exit statuses (herd/herd_kv_main.cc).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


def read_ready_line(process, timeout_s):
    """herd_server's "herd_server ready port=N ... config={...}" line."""
    deadline = time.monotonic() + timeout_s
    buffer = b""
    while b"\n" not in buffer:
        time_left = deadline - time.monotonic()
        if time_left <= 0:
            raise AssertionError(f"herd_server printed no ready line within {timeout_s} s")
        ready, _, _ = select.select([process.stdout], [], [], time_left)
        if ready:
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                raise AssertionError(f"herd_server exited ({process.wait()}) before it was ready")
            buffer += chunk
    line = buffer.split(b"\n", 1)[0].decode()
    if not line.startswith("herd_server ready"):
        raise AssertionError(f"herd_server said {line!r}, not its ready line")
    return line


class ServerTestCase(unittest.TestCase):
    """One server (started with SERVER_FLAGS) for the whole class; each test uses keys of its
    own."""

    SERVER_FLAGS = ["--mica_log_bytes=4194304"]

    @classmethod
    def setUpClass(cls):
        for binary in (SERVER, HERD_KV):
            if not binary.exists():
                raise AssertionError(f"{binary} is missing: bazel build --config=opt "
                                     "//herd:herd_server //herd:herd_kv (or set HERD_BIN)")
        cls.host = CM_ADDRESS or "127.0.0.1"
        if CM_ADDRESS:
            cls.fabric = ["--fabric=verbs", f"--device={os.environ['HERD_VERBS_DEVICE']}",
                          "--connect=cm"]
        else:
            cls.fabric = [f"--shm_fabric_name=herd-kv-test-{os.getpid()}"]
        cls.log = tempfile.TemporaryFile()
        cls.server = subprocess.Popen(
            [str(SERVER), "--port=0", f"--listen_address={cls.host}", "--workers=1",
             "--pin_workers=false", "--max_clients=8", "--mica_items=4096"]
            + cls.SERVER_FLAGS + cls.fabric,
            stdout=subprocess.PIPE, stderr=cls.log, start_new_session=True)
        try:
            ready = read_ready_line(cls.server, SERVER_READY_TIMEOUT_S)
        except AssertionError as error:
            cls.log.seek(0)
            log = cls.log.read().decode(errors="replace")
            cls.stop_server()
            raise AssertionError(f"{error}; its stderr:\n{log}") from None
        cls.address = f"{cls.host}:{ready.split('port=', 1)[1].split()[0]}"
        cls.config = json.loads(ready.split("config=", 1)[1])

    @classmethod
    def tearDownClass(cls):
        status = cls.stop_server()
        if status != 0:
            raise AssertionError(f"herd_server did not shut down cleanly: status {status}")

    @classmethod
    def stop_server(cls):
        """SIGTERM, then SIGKILL after SERVER_STOP_TIMEOUT_S; the server's exit status."""
        cls.server.send_signal(signal.SIGTERM)
        try:
            cls.server.wait(timeout=SERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            cls.server.kill()
            cls.server.wait()
        cls.server.stdout.close()
        cls.log.close()
        return cls.server.returncode

    def kv(self, *args, server=None, stdin=b""):
        """Runs herd_kv against the server; (exit status, stdout bytes, stderr text)."""
        command = [str(HERD_KV), f"--server={server or self.address}"] + self.fabric + list(args)
        done = subprocess.run(command, input=stdin, capture_output=True, timeout=RUN_TIMEOUT_S)
        return done.returncode, done.stdout, done.stderr.decode(errors="replace")

    def ok(self, *args, stdin=b""):
        """Runs herd_kv, which must succeed; its stdout."""
        code, stdout, stderr = self.kv(*args, stdin=stdin)
        self.assertEqual(code, EXIT_OK, f"herd_kv {' '.join(args)}: {stderr}")
        return stdout

    def version(self, *args, stdin=b""):
        """Runs a mutation, which must succeed; the new version it prints."""
        stdout = self.ok(*args, stdin=stdin)
        self.assertRegex(stdout.decode(), r"^\d+\n$")
        return int(stdout)

    def fails_with_status(self, name, *args):
        """Runs herd_kv, which must exit 1 with one stderr line naming status `name` first."""
        code, stdout, stderr = self.kv(*args)
        self.assertEqual(code, EXIT_FAILED, f"herd_kv {' '.join(args)}: {stderr}")
        self.assertTrue(stderr.startswith(f"herd_kv: {name}: "), stderr)
        self.assertEqual(stderr.count("\n"), 1, stderr)  # one line, nothing else
        self.assertEqual(stdout, b"")
        return stderr

    def usage_error(self, *args):
        code, stdout, stderr = self.kv(*args)
        self.assertEqual(code, EXIT_USAGE, stderr)
        self.assertTrue(stderr.startswith("herd_kv: "), stderr)
        self.assertIn("usage: herd_kv", stderr)
        self.assertEqual(stdout, b"")
        return stderr.splitlines()[0]


class HerdKvTest(ServerTestCase):
    # ---------------------------------------------------------------------- round trips
    def test_put_then_get_round_trips_text(self):
        version = self.version("put", "text", "hello world")
        self.assertEqual(self.ok("get", "text"), b"hello world")  # exactly: no newline on a pipe
        code, stdout, stderr = self.kv("--show_version", "get", "text")
        self.assertEqual((code, stdout, stderr), (EXIT_OK, b"hello world", f"version={version}\n"))
        self.assertGreater(self.version("put", "text", "again"), version)
        self.assertEqual(self.ok("get", "text"), b"again")

    def test_binary_key_and_value_round_trip_through_hex(self):
        key, value = "00ff0a", "00ff00ff41"
        self.version("--hex", "put", key, value)
        self.assertEqual(self.ok("--hex", "get", key), f"{value}\n".encode())
        self.assertEqual(self.ok("--hex", "get", key.upper()), f"{value}\n".encode())

    def test_binary_value_round_trips_through_value_file_and_stdin(self):
        value = b"\x00\xff\x00binary\n\xff\x00"
        with tempfile.NamedTemporaryFile() as file:
            file.write(value)
            file.flush()
            self.version("put", "file", f"--value_file={file.name}")
        self.assertEqual(self.ok("get", "file"), value)
        self.assertEqual(self.ok("--hex", "get", "66696c65"), f"{value.hex()}\n".encode())
        self.version("put", "stdin", "--value_file=-", stdin=value[::-1])
        self.assertEqual(self.ok("get", "stdin"), value[::-1])

    def test_an_argument_after_dashes_may_start_with_a_dash(self):
        self.version("put", "dashes", "--", "-1")
        self.assertEqual(self.ok("get", "--", "dashes"), b"-1")

    def test_the_largest_value_fits_and_one_byte_more_is_value_too_long(self):
        # The server's value limit (1 MiB by default: larger than a slot, so it travels out of
        # line); through files, as an argument that long exceeds what exec passes.
        largest = self.config["max_value_bytes"]
        with tempfile.NamedTemporaryFile() as file:
            file.write(b"v" * largest)
            file.flush()
            self.version("put", "large", f"--value_file={file.name}")
        self.assertEqual(self.ok("get", "large"), b"v" * largest)
        for size in (largest + 1, 2 * largest):
            with tempfile.NamedTemporaryFile() as file:
                file.write(b"x" * size)
                file.flush()
                self.fails_with_status("VALUE_TOO_LONG", "put", "large",
                                       f"--value_file={file.name}")
        self.assertEqual(self.ok("get", "large"), b"v" * largest)  # untouched

    def test_a_value_just_over_the_inline_limit_round_trips(self):
        inline = self.config["inline_value_limit"]
        value = bytes(range(256)) * (inline // 256 + 1)
        value = value[: inline + 1]
        self.version("--hex", "put", "6f6f6c", value.hex())
        self.assertEqual(self.ok("--hex", "get", "6f6f6c"), f"{value.hex()}\n".encode())

    # ---------------------------------------------------------------------- failures
    def test_insert_twice_is_exists_naming_the_present_version(self):
        version = self.version("insert", "insert-once", "first")
        stderr = self.fails_with_status("EXISTS", "insert", "insert-once", "second")
        self.assertIn(f"version {version}", stderr)
        self.assertEqual(self.ok("get", "insert-once"), b"first")

    def test_cas_with_a_wrong_version_is_cas_failed_and_the_right_one_succeeds(self):
        version = self.version("put", "cas", "old")
        stderr = self.fails_with_status("CAS_FAILED", "cas", "cas", str(version + 100), "new")
        self.assertIn(f"version is {version}", stderr)
        self.assertEqual(self.ok("get", "cas"), b"old")
        self.assertGreater(self.version("cas", "cas", str(version), "new"), version)
        self.assertEqual(self.ok("get", "cas"), b"new")

    def test_del_then_get_is_not_found(self):
        version = self.version("put", "deleted", "soon gone")
        self.assertGreater(self.version("del", "deleted"), version)
        self.fails_with_status("NOT_FOUND", "get", "deleted")
        self.fails_with_status("NOT_FOUND", "get", "never-put")

    def test_a_key_too_long_is_key_too_long(self):
        self.fails_with_status("KEY_TOO_LONG", "put", "k" * (self.config["max_key_bytes"] + 1),
                               "v")
        self.fails_with_status("KEY_TOO_LONG", "get", "")

    def test_stats_prints_the_servers_json(self):
        stats = json.loads(self.ok("stats"))
        self.assertIn("uptime_s", stats)
        self.assertEqual(stats["config"], self.config)

    # ---------------------------------------------------------------------- usage and reach
    def test_usage_errors_exit_2(self):
        self.assertIn("unknown command 'frobnicate'", self.usage_error("frobnicate", "k"))
        self.assertIn("no command", self.usage_error())
        self.usage_error("get")
        self.usage_error("get", "k", "extra")
        self.usage_error("put", "k")
        self.usage_error("cas", "k", "1")
        self.assertIn("not a version number", self.usage_error("cas", "k", "one", "v"))
        self.assertIn("not a hex string", self.usage_error("--hex", "get", "0g"))
        self.assertIn("not a hex string", self.usage_error("--hex", "put", "00", "abc"))
        self.assertIn("unknown flag --frobnicate", self.usage_error("--frobnicate", "get", "k"))
        self.assertIn("not a valid uint32", self.usage_error("--timeout_ms=soon", "get", "k"))
        self.usage_error("put", "k", "v", "--value_file=/dev/null")
        self.usage_error("get", "k", "--value_file=/dev/null")
        self.assertIn("cannot open", self.usage_error("put", "k", "--value_file=/nonexistent/f"))

    def test_a_value_file_that_cannot_be_read_whole_stores_nothing(self):
        # Each once stored an empty value and exited 0, aborted on an uncaught exception, or
        # read until memory ran out.
        self.assertIn("cannot read it", self.usage_error("put", "bad-dir", "--value_file=/"))
        self.assertIn("cannot read it",
                      self.usage_error("put", "bad-mem", "--value_file=/proc/self/mem"))
        self.assertIn("longer than the largest value",
                      self.usage_error("put", "bad-zero", "--value_file=/dev/zero"))
        directory = os.open("/", os.O_RDONLY)
        try:
            for name, stdin, extra in (("bad-closed", None, {"preexec_fn": lambda: os.close(0)}),
                                       ("bad-stdin-dir", directory, {})):
                done = subprocess.run(
                    [str(HERD_KV), f"--server={self.address}"] + self.fabric
                    + ["put", name, "--value_file=-"],
                    stdin=stdin, capture_output=True, timeout=RUN_TIMEOUT_S, **extra)
                stderr = done.stderr.decode(errors="replace")
                self.assertEqual(done.returncode, EXIT_USAGE, f"{name}: {stderr}")
                self.assertIn("--value_file=- (stdin): cannot read it", stderr)
        finally:
            os.close(directory)
        for name in ("bad-dir", "bad-mem", "bad-zero", "bad-closed", "bad-stdin-dir"):
            code, _, stderr = self.kv("get", name)
            self.assertEqual(code, EXIT_FAILED, f"{name} was stored: {stderr}")
            self.assertIn("NOT_FOUND", stderr)

    def test_help_exits_0(self):
        code, stdout, _ = self.kv("--helpshort")
        self.assertEqual(code, EXIT_OK)
        self.assertIn(b"usage: herd_kv", stdout)
        self.assertIn(b"Exit status", stdout)

    def test_a_server_nobody_runs_is_unreachable(self):
        # A bound socket that never listens: connecting to its port is refused, and nothing else
        # can take the port meanwhile (over RDMA-CM: a port no CM listener has, where the
        # connection is rejected).
        with socket.socket() as unused:
            unused.bind((self.host, 0))
            nobody = f"{self.host}:{unused.getsockname()[1]}"
            for command in (["get", "k"], ["put", "k", "v"], ["stats"]):
                code, stdout, stderr = self.kv("--timeout_ms=200", *command, server=nobody)
                self.assertEqual(code, EXIT_UNREACHABLE, stderr)
                self.assertTrue(stderr.startswith("herd_kv: UNAVAILABLE"), stderr)
                self.assertEqual(stderr.count("\n"), 1, stderr)
                self.assertEqual(stdout, b"")


class HerdKvNoMemoryTest(ServerTestCase):
    """A server whose log (512 KiB) is shorter than its largest value's item and whose landing
    buffers hold values up to 768 KiB only (issue 15's NO_MEMORY, both kinds)."""

    LOG_BYTES = 512 << 10
    LANDING_VALUE_BYTES = 768 << 10
    SERVER_FLAGS = [f"--mica_log_bytes={LOG_BYTES}",
                    f"--landing_value_bytes={LANDING_VALUE_BYTES}"]

    def put_from_file(self, key, size):
        with tempfile.NamedTemporaryFile() as file:
            file.write(b"n" * size)
            file.flush()
            return self.kv("put", key, f"--value_file={file.name}")

    def test_values_past_the_log_or_the_landing_buffers_are_no_memory(self):
        self.version("put", "kept", "value")
        # Fits a landing buffer, but its item is longer than the whole log: the worker says so.
        code, stdout, stderr = self.put_from_file("past-log", self.LOG_BYTES)
        self.assertEqual((code, stdout), (EXIT_FAILED, b""), stderr)
        self.assertTrue(stderr.startswith("herd_kv: NO_MEMORY: the worker has no room"), stderr)
        self.assertIn("log", stderr)
        # Longer than a landing buffer: the client says so, naming both sizes, and sends nothing.
        # (A buffer holds a CAS of the limit; a PUT's header is a word shorter: 9 bytes over.)
        code, stdout, stderr = self.put_from_file("past-landing", self.LANDING_VALUE_BYTES + 9)
        self.assertEqual((code, stdout), (EXIT_FAILED, b""), stderr)
        self.assertTrue(stderr.startswith("herd_kv: NO_MEMORY: "), stderr)
        self.assertIn("landing buffers", stderr)
        self.assertEqual(stderr.count("\n"), 1, stderr)
        self.fails_with_status("NOT_FOUND", "get", "past-log")
        self.assertEqual(self.ok("get", "kept"), b"value")  # nothing evicted


def replication_binaries():
    """herd_admin's path, once herd_server, herd_kv and herd_admin are known to be built."""
    admin = BIN / "herd" / "herd_admin"
    for binary in (SERVER, HERD_KV, admin):
        if not binary.exists():
            raise AssertionError(f"{binary} is missing: bazel build --config=opt //herd/...")
    return admin


def stop_server(server):
    """SIGTERM, then SIGKILL past SERVER_STOP_TIMEOUT_S; closes its stdout pipe."""
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=SERVER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    server.stdout.close()


class HerdKvMembersTest(unittest.TestCase):
    """--members on a replicated store (a primary and one backup on a shm fabric): a mutation
    sent to the backup is refused NOT_PRIMARY and goes on to the primary; after the primary is
    killed and the backup promoted (herd_admin), --server naming the dead primary finds the
    promoted backup and every acknowledged write is there. Runs on shm only: the Soft-RoCE
    guest runs herd_kv's join cases, and replication's verbs tests are the C++ ones."""

    @classmethod
    def setUpClass(cls):
        cls.admin = replication_binaries()
        cls.fabric = [f"--shm_fabric_name=herd-kv-members-{os.getpid()}"]
        cls.logs = []
        cls.backup, ready = cls.start(["--role=backup", "--replication_port=0"])
        cls.backup_address = "127.0.0.1:" + ready.split(" port=", 1)[1].split()[0]
        replication_port = ready.split("replication_port=", 1)[1].split()[0]
        try:
            cls.primary, ready = cls.start(
                ["--role=primary", f"--backups=127.0.0.1:{replication_port}"])
        except AssertionError:
            cls.backup.kill()
            cls.backup.wait()
            raise
        cls.primary_address = "127.0.0.1:" + ready.split(" port=", 1)[1].split()[0]

    @classmethod
    def start(cls, flags):
        log = tempfile.TemporaryFile()
        cls.logs.append(log)
        server = subprocess.Popen(
            [str(SERVER), "--port=0", "--workers=1", "--pin_workers=false", "--max_clients=8",
             "--mica_items=4096", "--mica_log_bytes=4194304"] + flags + cls.fabric,
            stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        try:
            return server, read_ready_line(server, SERVER_READY_TIMEOUT_S)
        except AssertionError as error:
            server.kill()
            log.seek(0)
            raise AssertionError(f"{error}; its stderr:\n{log.read().decode()}") from None

    @classmethod
    def tearDownClass(cls):
        for server in (cls.primary, cls.backup):
            stop_server(server)
        for log in cls.logs:
            log.close()

    def kv(self, server, *args):
        command = ([str(HERD_KV), f"--server={server}",
                    f"--members={self.primary_address},{self.backup_address}",
                    "--timeout_ms=2000"] + self.fabric + list(args))
        done = subprocess.run(command, capture_output=True, timeout=RUN_TIMEOUT_S)
        return done.returncode, done.stdout, done.stderr.decode(errors="replace")

    def test_members_reach_the_primary_and_then_the_promoted_backup(self):
        # Alone, the backup refuses a mutation, unexecuted.
        done = subprocess.run([str(HERD_KV), f"--server={self.backup_address}"] + self.fabric
                              + ["put", "k", "v"], capture_output=True, timeout=RUN_TIMEOUT_S)
        self.assertEqual(done.returncode, EXIT_FAILED, done.stderr)
        self.assertTrue(done.stderr.startswith(b"herd_kv: NOT_PRIMARY: "), done.stderr)
        # With the members, the same command goes on to the primary.
        versions = {}
        for i in range(8):
            code, stdout, stderr = self.kv(self.backup_address, "put", f"key-{i}", f"value-{i}")
            self.assertEqual(code, EXIT_OK, stderr)
            versions[i] = int(stdout)
        code, stdout, stderr = self.kv(self.backup_address, "get", "key-3")
        self.assertEqual((code, stdout), (EXIT_OK, b"value-3"), stderr)
        # The primary dies; the backup is promoted. --server still names the dead primary.
        self.primary.kill()
        self.primary.wait()
        promoted = subprocess.run([str(self.admin), "promote", self.backup_address],
                                  capture_output=True, timeout=60)
        self.assertEqual(promoted.returncode, 0, promoted.stderr)
        for i in range(8):  # every acknowledged write, at its version
            code, stdout, stderr = self.kv(self.primary_address, "get", f"key-{i}",
                                           "--show_version")
            self.assertEqual((code, stdout), (EXIT_OK, f"value-{i}".encode()), stderr)
            self.assertIn(f"version={versions[i]}", stderr)
        code, stdout, stderr = self.kv(self.primary_address, "put", "after", "failover")
        self.assertEqual(code, EXIT_OK, stderr)
        code, stdout, stderr = self.kv(self.primary_address, "get", "after")
        self.assertEqual((code, stdout), (EXIT_OK, b"failover"), stderr)

    def test_members_that_are_all_gone_are_unreachable_naming_how_many(self):
        with socket.socket() as one, socket.socket() as two:
            one.bind(("127.0.0.1", 0))
            two.bind(("127.0.0.1", 0))
            gone = [f"127.0.0.1:{s.getsockname()[1]}" for s in (one, two)]
            # No --server: the members alone (never the default port).
            done = subprocess.run(
                [str(HERD_KV), f"--members={gone[0]},{gone[1]}",
                 "--timeout_ms=200"] + self.fabric + ["get", "k"],
                capture_output=True, timeout=RUN_TIMEOUT_S)
        stderr = done.stderr.decode()
        self.assertEqual(done.returncode, EXIT_UNREACHABLE, stderr)
        self.assertTrue(stderr.startswith("herd_kv: UNAVAILABLE"), stderr)
        self.assertIn(f"(members tried: {gone[0]} UNAVAILABLE, {gone[1]} UNAVAILABLE)", stderr)
        self.assertEqual(stderr.count("\n"), 1, stderr)

    def test_a_malformed_member_is_a_usage_error(self):
        for members, message in (("127.0.0.1:1,nohost", b"--members: 'nohost' is not host:port"),
                                 (",", b"--members names no HOST:PORT")):
            done = subprocess.run([str(HERD_KV), f"--members={members}", "get", "k"],
                                  capture_output=True, timeout=RUN_TIMEOUT_S)
            self.assertEqual(done.returncode, EXIT_USAGE, done.stderr)
            self.assertIn(message, done.stderr)



class HerdKvFollowTest(unittest.TestCase):
    """A mutation outstanding when its primary dies is handed to the promoted backup: the
    primary's UD answers are all lost (--inject_ud_loss=1), so herd_kv's INSERT executes and is
    replicated but never answered; the primary is killed and the backup promoted while herd_kv
    waits; herd_kv follows and prints the version the old primary gave it (the replicated
    outcome, not a second execution, which would be EXISTS). A GET outstanding at the dead
    primary is asked of the next member instead, before any promotion."""

    # Versions at or past this were handed out by a promoted primary (server_replication.cc).
    PROMOTED_VERSIONS = 1 << 32
    # herd_kv's wait for the answer: through the kill and the promotion.
    FOLLOW_TIMEOUT_MS = 20000

    def setUp(self):
        self.admin = replication_binaries()
        self.fabric = [f"--shm_fabric_name=herd-kv-follow-{os.getpid()}"]
        self.logs = []
        backup, ready = self.start(["--role=backup", "--replication_port=0"])
        self.backup_address = "127.0.0.1:" + ready.split(" port=", 1)[1].split()[0]
        replication_port = ready.split("replication_port=", 1)[1].split()[0]
        self.primary, ready = self.start(["--role=primary", f"--backups=127.0.0.1:{replication_port}",
                                          "--inject_ud_loss=1"])
        self.primary_address = "127.0.0.1:" + ready.split(" port=", 1)[1].split()[0]

    def start(self, flags):
        log = tempfile.TemporaryFile()
        self.logs.append(log)
        self.addCleanup(log.close)
        server = subprocess.Popen(
            [str(SERVER), "--port=0", "--workers=1", "--pin_workers=false", "--max_clients=8",
             "--mica_items=4096", "--mica_log_bytes=4194304"] + flags + self.fabric,
            stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        self.addCleanup(stop_server, server)
        try:
            return server, read_ready_line(server, SERVER_READY_TIMEOUT_S)
        except AssertionError as error:
            log.seek(0)
            raise AssertionError(f"{error}; its stderr:\n{log.read().decode()}") from None

    def kv_command(self, server, *args, timeout_ms=FOLLOW_TIMEOUT_MS):
        return ([str(HERD_KV), f"--server={server}",
                 f"--members={self.primary_address},{self.backup_address}",
                 f"--timeout_ms={timeout_ms}"] + self.fabric + list(args))

    def primary_stats(self):
        done = subprocess.run([str(HERD_KV), f"--server={self.primary_address}", "stats"]
                              + self.fabric, capture_output=True, timeout=RUN_TIMEOUT_S)
        self.assertEqual(done.returncode, EXIT_OK, done.stderr)
        return json.loads(done.stdout)["stats"]

    def await_primary(self, done, what, *processes):
        give_up = time.monotonic() + RUN_TIMEOUT_S
        while not done(self.primary_stats()):
            for process in processes:
                self.assertIsNone(process.poll(), f"herd_kv ended before the failover ({what})")
            self.assertLess(time.monotonic(), give_up, what)

    def test_with_no_member_promoted_an_outstanding_mutation_ends_outcome_unknown(self):
        # Short enough to give up soon: the backup is never promoted.
        insert = subprocess.Popen(
            self.kv_command(self.primary_address, "insert", "k", "once", timeout_ms=1500),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.addCleanup(insert.communicate)
        self.addCleanup(lambda: insert.poll() is None and insert.kill())
        self.await_primary(lambda stats: stats["replication"]["released"] >= 1,
                           "the INSERT was never released", insert)
        self.primary.kill()
        self.primary.wait()
        stdout, stderr = insert.communicate(timeout=RUN_TIMEOUT_S)
        self.assertEqual((insert.returncode, stdout), (EXIT_UNREACHABLE, b""), stderr)
        self.assertTrue(stderr.startswith(b"herd_kv: TIMED_OUT: the server was lost"), stderr)
        self.assertIn(b"its outcome is unknown", stderr)

    def test_requests_outstanding_at_a_killed_primary_are_answered_by_the_members(self):
        insert = subprocess.Popen(self.kv_command(self.primary_address, "insert", "k", "once"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.addCleanup(insert.communicate)
        self.addCleanup(lambda: insert.poll() is None and insert.kill())
        # Executed and held by the backup (released), its answer lost.
        self.await_primary(lambda stats: stats["replication"]["released"] >= 1,
                           "the INSERT was never released", insert)
        # A GET of it read at the primary (a hit), its answer lost too.
        get = subprocess.Popen(self.kv_command(self.primary_address, "get", "k"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.addCleanup(get.communicate)
        self.addCleanup(lambda: get.poll() is None and get.kill())
        self.await_primary(lambda stats: stats["get_hit_ratio"][0] is not None,
                           "the GET never reached the primary", insert, get)
        self.primary.kill()
        self.primary.wait()
        # The GET goes on to the next member (the backup serves GETs) without a promotion.
        stdout, stderr = get.communicate(timeout=RUN_TIMEOUT_S)
        self.assertEqual((get.returncode, stdout), (EXIT_OK, b"once"), stderr)
        # The INSERT waits for one: the backup's, which answers from the replicated outcome.
        promoted = subprocess.run([str(self.admin), "promote", self.backup_address],
                                  capture_output=True, timeout=60)
        self.assertEqual(promoted.returncode, 0, promoted.stderr)
        stdout, stderr = insert.communicate(timeout=RUN_TIMEOUT_S)
        self.assertEqual(insert.returncode, EXIT_OK, stderr)
        version = int(stdout)
        self.assertLess(version, self.PROMOTED_VERSIONS, "executed again by the new primary")
        # Applied once, at that version.
        done = subprocess.run(self.kv_command(self.backup_address, "get", "k", "--show_version",
                                              timeout_ms=2000),
                              capture_output=True, timeout=RUN_TIMEOUT_S)
        self.assertEqual((done.returncode, done.stdout), (EXIT_OK, b"once"), done.stderr)
        self.assertIn(f"version={version}".encode(), done.stderr)


def backups_in_sync(admin, primary, count, timeout_s):
    """Whether the coordinated primary at `primary` counts `count` backups in its configuration,
    all live (joined by state transfer), within `timeout_s`: asked with herd_admin stats."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        stats = subprocess.run([str(admin), "stats", primary], capture_output=True,
                               timeout=RUN_TIMEOUT_S)
        try:
            replication = json.loads(stats.stdout)["stats"]["replication"]
        except (ValueError, KeyError):
            replication = {}
        if replication.get("backups") == count and replication.get("live_backups") == count:
            return True
        time.sleep(0.1)
    return False


def stop_cluster(servers, logs, zk_dir):
    """Stops a coordinated cluster's servers ({name: process}), closes their logs and stops its
    private ZooKeeper (scripts/zk.sh in `zk_dir`), removing its folder."""
    for server in servers.values():
        stop_server(server)
    for log in logs:
        log.close()
    subprocess.run([str(REPO / "scripts" / "zk.sh"), "stop", zk_dir], timeout=60)
    shutil.rmtree(zk_dir, ignore_errors=True)


class HerdKvCoordinatorTest(unittest.TestCase):
    """--coordinator on a coordinated cluster (a private ZooKeeper, a primary and two backups
    that join it by state transfer): herd_kv finds the primary through the configuration, and
    after the primary is killed and a backup takes over by itself (no operator), the same
    command reaches the new primary and every acknowledged write is there."""

    SESSION_MS = 2000
    DEADLINE_S = 60

    @classmethod
    def setUpClass(cls):
        cls.admin = replication_binaries()
        cls.zk_dir = tempfile.mkdtemp(prefix="herd-kv-zk-")
        started = subprocess.run([str(REPO / "scripts" / "zk.sh"), "start", cls.zk_dir],
                                 capture_output=True, timeout=RUN_TIMEOUT_S,
                                 env={**os.environ, "HERD_ZK_OWNER": str(os.getpid())})
        assert started.returncode == 0, started.stderr.decode(errors="replace")
        cls.zk = started.stdout.decode().strip()
        cls.fabric = [f"--shm_fabric_name=herd-kv-coordinator-{os.getpid()}"]
        cls.servers = {}
        cls.addresses = {}
        cls.logs = []
        for name, role in (("a", "primary"), ("b", "backup"), ("c", "backup")):
            log = tempfile.TemporaryFile()
            cls.logs.append(log)
            server = subprocess.Popen(
                [str(SERVER), "--port=0", "--replication_port=0", "--workers=1",
                 "--pin_workers=false", "--max_clients=8", "--mica_items=4096",
                 "--mica_log_bytes=4194304", f"--coordinator={cls.zk}", "--cluster=kv",
                 f"--member={name}", f"--role={role}",
                 f"--session_timeout_ms={cls.SESSION_MS}"] + cls.fabric,
                stdout=subprocess.PIPE, stderr=log, start_new_session=True)
            cls.servers[name] = server
            ready = read_ready_line(server, SERVER_READY_TIMEOUT_S)
            cls.addresses[name] = "127.0.0.1:" + ready.split(" port=", 1)[1].split()[0]
            if name == "a":
                cls.primary_address = cls.addresses[name]
        # Both backups in sync (joined by state transfer, added to the configuration).
        assert backups_in_sync(cls.admin, cls.primary_address, 2, cls.DEADLINE_S), \
            "the backups never joined the coordinated primary"

    @classmethod
    def tearDownClass(cls):
        stop_cluster(cls.servers, cls.logs, cls.zk_dir)

    def kv(self, *args):
        done = subprocess.run([str(HERD_KV), f"--coordinator={self.zk}", "--cluster=kv",
                               "--timeout_ms=3000"] + self.fabric + list(args),
                              capture_output=True, timeout=RUN_TIMEOUT_S)
        return done.returncode, done.stdout, done.stderr.decode(errors="replace")

    def test_the_configuration_leads_to_the_primary_before_and_after_a_failover(self):
        code, stdout, stderr = self.kv("put", "k", "v1")
        self.assertEqual(code, EXIT_OK, stderr)
        first_version = int(stdout)
        code, stdout, stderr = self.kv("get", "k")
        self.assertEqual((code, stdout), (EXIT_OK, b"v1"), stderr)
        self.servers["a"].kill()
        self.servers["a"].wait()
        # A backup takes over about a session timeout later; until then the configuration still
        # names the dead primary and the backups refuse writes.
        deadline = time.time() + self.DEADLINE_S
        while True:
            code, stdout, stderr = self.kv("put", "k", "v2")
            if code == EXIT_OK:
                break
            self.assertLess(time.time(), deadline, stderr)
            time.sleep(0.1)
        self.assertGreater(int(stdout), first_version)  # versions never reused across epochs
        code, stdout, stderr = self.kv("get", "k")
        self.assertEqual((code, stdout), (EXIT_OK, b"v2"), stderr)
        code, _, stderr = self.kv("--members=127.0.0.1:1", "get", "k")
        self.assertEqual(code, EXIT_USAGE, stderr)
        self.assertIn("drop --members", stderr)

    def test_herd_client_runs_against_the_primary_the_configuration_names(self):
        # Workload A (half PUTs): a run sent to a backup would end every PUT NOT_PRIMARY.
        done = subprocess.run(
            [str(HERD_CLIENT), f"--coordinator={self.zk}", "--cluster=kv", "--workload=A",
             "--keys=200", "--duration_s=0.5", "--warmup_s=0.1", "--threads=1",
             "--clients_per_thread=2"] + self.fabric, capture_output=True, timeout=RUN_TIMEOUT_S)
        self.assertEqual(done.returncode, 0, done.stderr.decode(errors="replace")[-2000:])
        result = json.loads(done.stdout.decode().strip().splitlines()[-1])
        self.assertGreater(result["ops"], 0)
        self.assertEqual(result["errors"], 0, result)
        self.assertIn(result["server"], self.addresses.values())
        both = subprocess.run([str(HERD_CLIENT), f"--coordinator={self.zk}",
                               "--server=127.0.0.1:1"] + self.fabric,
                              capture_output=True, timeout=RUN_TIMEOUT_S)
        self.assertNotEqual(both.returncode, 0)
        self.assertIn(b"drop --server", both.stderr)

    def test_a_coordinator_nobody_runs_is_unreachable(self):
        done = subprocess.run([str(HERD_KV), "--coordinator=127.0.0.1:1", "--timeout_ms=300",
                               "get", "k"], capture_output=True, timeout=RUN_TIMEOUT_S)
        self.assertEqual(done.returncode, EXIT_UNREACHABLE, done.stderr)
        self.assertIn(b"127.0.0.1:1", done.stderr)

class HerdClientFollowTest(unittest.TestCase):
    """herd_client --coordinator through a failover: the primary is killed (SIGKILL) while the
    run is being measured; each client thread follows the backup that takes over (its
    outstanding requests carried over) and the run completes with every GET finding its
    preloaded key, no error, and the follow counted in its JSON."""

    SESSION_MS = 2000
    DEADLINE_S = 60

    def setUp(self):
        self.admin = replication_binaries()
        self.zk_dir = tempfile.mkdtemp(prefix="herd-client-follow-zk-")
        started = subprocess.run([str(REPO / "scripts" / "zk.sh"), "start", self.zk_dir],
                                 capture_output=True, timeout=RUN_TIMEOUT_S,
                                 env={**os.environ, "HERD_ZK_OWNER": str(os.getpid())})
        self.assertEqual(started.returncode, 0, started.stderr.decode(errors="replace"))
        self.zk = started.stdout.decode().strip()
        self.fabric = [f"--shm_fabric_name=herd-client-follow-{os.getpid()}"]
        self.servers, self.logs = {}, []
        for name, role in (("a", "primary"), ("b", "backup")):
            log = tempfile.TemporaryFile()
            self.logs.append(log)
            server = subprocess.Popen(
                [str(SERVER), "--port=0", "--replication_port=0", "--workers=1",
                 "--pin_workers=false", "--max_clients=8", "--mica_items=4096",
                 "--mica_log_bytes=4194304", "--store_mode=store", f"--coordinator={self.zk}",
                 "--cluster=follow", f"--member={name}", f"--role={role}",
                 f"--session_timeout_ms={self.SESSION_MS}"] + self.fabric,
                stdout=subprocess.PIPE, stderr=log, start_new_session=True)
            self.servers[name] = server
            ready = read_ready_line(server, SERVER_READY_TIMEOUT_S)
            if name == "a":
                self.primary = "127.0.0.1:" + ready.split(" port=", 1)[1].split()[0]
        self.assertTrue(backups_in_sync(self.admin, self.primary, 1, self.DEADLINE_S),
                        "the backup never joined the coordinated primary")

    def tearDown(self):
        stop_cluster(self.servers, self.logs, self.zk_dir)

    def test_a_run_follows_a_failover_and_loses_no_preloaded_key(self):
        client = subprocess.Popen(
            [str(HERD_CLIENT), f"--coordinator={self.zk}", "--cluster=follow", "--workload=C",
             "--keys=500", "--warmup_s=0.2", "--duration_s=12", "--threads=1",
             "--clients_per_thread=4", "--client_cores=none"] + self.fabric,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.addCleanup(lambda: client.poll() is None and (client.kill(), client.wait()))
        # Killed once the measured window runs (its first progress line).
        deadline = time.monotonic() + self.DEADLINE_S
        seen = b""
        while b"progress" not in seen:
            self.assertLess(time.monotonic(), deadline, "the run never started measuring")
            ready, _, _ = select.select([client.stderr], [], [], 1)
            if ready:
                chunk = os.read(client.stderr.fileno(), 4096)
                self.assertTrue(chunk, "herd_client ended before measuring: " +
                                seen.decode(errors="replace")[-2000:])
                seen += chunk
        self.servers["a"].kill()
        self.servers["a"].wait()
        stdout, stderr = client.communicate(timeout=self.DEADLINE_S + 30)
        log = (seen + stderr).decode(errors="replace")[-3000:]
        self.assertEqual(client.returncode, 0, log)
        result = json.loads(stdout.decode().strip().splitlines()[-1])
        self.assertEqual(result["followed"], 1, log)
        self.assertGreater(result["follow_s_max"], 0)
        self.assertEqual(result["errors"], 0, result)
        self.assertGreater(result["gets"], 0)
        self.assertEqual(result["get_misses"], 0, "a preloaded key was lost in the failover")


if __name__ == "__main__":
    unittest.main()
