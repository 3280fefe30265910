"""The hosts of an experiment of scripts/herd_exp.py: how each is reached, what is checked on each
before a run starts (its checkout, its build, its RDMA device and GID, its addresses), and what a
run left running on each.

A host is run on directly when its address is loopback (and no ssh_port says otherwise), else
over ssh in BatchMode (keys only, no prompt), every command of a run to a host on one shared
connection (share_connections: one handshake per host, not one per command). Every process the runner starts carries the run's
marker in its environment (HERD_EXP_RUN=<id>), so what is left of a run on a host can be found
and killed there, however it was started; only processes in the checking shell's own network
namespace count as the host's (a box of namespaces shares one process table).
"""
import hashlib
import ipaddress
import os
import pathlib
import shlex
import shutil
import socket
import subprocess
import tempfile
from concurrent import futures

ROLES = ("server", "client", "backup", "coordinator")
FIELDS = {"name", "address", "role", "cores", "device", "gid_index", "ssh_user", "ssh_port",
          "ssh_key", "ssh_options", "repo", "listen_address"}
# The environment variable that marks a run's processes.
MARKER = "HERD_EXP_RUN"
# How long one check over ssh may take (a slow guest's ssh handshake takes seconds).
CHECK_TIMEOUT_S = 120
# What a host's shell says when it has no checkout at `repo` (Host.shell).
NO_CHECKOUT = "herd-exp: no checkout at"
# A host's shared ssh connection (share_connections) ends this long after its last command
# unless the run closes it first: a run killed outright leaves none behind for longer.
CONTROL_PERSIST_S = 60
# How long closing one shared connection may take.
CONTROL_EXIT_TIMEOUT_S = 15
# A GID table entry that holds nothing.
EMPTY_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


class HostError(Exception):
    """A host entry or a host that cannot run the experiment; the message names the host."""


class Host:
    def __init__(self, spec, default_repo):
        unknown = set(spec) - FIELDS
        if unknown:
            raise HostError(f"host {spec.get('name')}: unknown fields {sorted(unknown)}")
        for field in ("name", "address", "role"):
            if field not in spec:
                raise HostError(f"host {spec}: '{field}' is required")
        if spec["role"] not in ROLES:
            raise HostError(f"host {spec['name']}: role must be one of {', '.join(ROLES)}")
        self.name = spec["name"]
        self.address = str(spec["address"])
        self.role = spec["role"]
        self.cores = spec.get("cores")
        self.device = spec.get("device")
        self.gid_index = spec.get("gid_index")
        self.ssh_user = spec.get("ssh_user")
        self.ssh_port = spec.get("ssh_port")
        self.ssh_key = spec.get("ssh_key")
        self.ssh_options = list(spec.get("ssh_options") or [])
        self.repo = str(spec.get("repo", default_repo))
        # What its servers bind (herd_server --listen_address); others reach it at `address`.
        self.listen_address = spec.get("listen_address")
        self.loopback = self.address in ("localhost", "127.0.0.1", "::1")
        # A loopback host runs directly unless an ssh port says to go through sshd anyway.
        self.local = self.loopback and "ssh_port" not in spec
        # Where its shared ssh connection's socket is (share_connections); None: a handshake
        # per command.
        self.control_path = None

    def __repr__(self):
        return f"{self.name} ({self.address})"

    def reach_address(self):
        """The address other processes of the run use to reach this host's servers."""
        return "127.0.0.1" if self.local else self.address

    def ssh_target(self):
        return f"{self.ssh_user}@{self.address}" if self.ssh_user else self.address

    def ssh_options_argv(self):
        command = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new"]
        if self.ssh_port:
            command += ["-p", str(self.ssh_port)]
        if self.ssh_key:
            command += ["-i", str(self.ssh_key)]
        if self.control_path:
            # The first command's ssh becomes the master; the others open sessions on it.
            command += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_path}",
                        "-o", f"ControlPersist={CONTROL_PERSIST_S}"]
        for option in self.ssh_options:
            command += ["-o", option]
        return command

    def ssh_prefix(self):
        return self.ssh_options_argv() + [self.ssh_target()]

    def shell(self, script):
        """argv that runs bash `script` on this host (in its checkout's folder)."""
        repo = shlex.quote(self.repo)
        script = (f"cd {repo} 2>/dev/null || {{ echo '{NO_CHECKOUT}' {repo} >&2; exit 3; }}; "
                  f"{{ {script}\n}}")
        if self.local:
            return ["bash", "-c", script]
        return self.ssh_prefix() + ["bash", "-c", shlex.quote(script)]

    def run(self, script, timeout_s=CHECK_TIMEOUT_S):
        """(exit status, stdout, stderr) of `script` on this host; 255 where it was unreachable
        or timed out."""
        try:
            done = subprocess.run(self.shell(script), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=timeout_s, check=False,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return 255, "", f"no answer within {timeout_s} s"
        return done.returncode, done.stdout.decode(errors="replace"), \
            done.stderr.decode(errors="replace")


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _probe_script(host, fabric, binaries):
    """bash that prints what the checks need, one "key value..." line each."""
    lines = [f"echo checkout {shlex.quote(host.repo)}"]
    for binary in binaries:
        quoted = shlex.quote(str(binary))
        lines.append(f"if [ -x {quoted} ]; then echo binary {quoted} "
                     f"$(sha256sum <{quoted} | cut -d' ' -f1); else echo binary {quoted} none; fi")
    lines.append("echo addresses $(ip -o addr show 2>/dev/null | awk '{print $4}' | "
                 "cut -d/ -f1 | tr '\\n' ' ')")
    if fabric == "verbs":
        lines.append("echo devices $(ls /sys/class/infiniband 2>/dev/null | tr '\\n' ' ')")
        if host.device and host.gid_index is not None:
            gid = f"/sys/class/infiniband/{host.device}/ports/1/gids/{int(host.gid_index)}"
            lines.append(f"echo gid $(cat {shlex.quote(gid)} 2>/dev/null || echo missing)")
    return "\n".join(lines)


def _is_ip(text):
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def check_host(host, fabric, binaries, local_repo):
    """What is wrong with `host` for this run: a list of messages, each naming the host."""
    if host.local or host.role == "coordinator":
        # This machine and checkout: the build just made (or used) is its own. A coordinator host
        # runs ZooKeeper from the checkout's scripts/zk.sh: no herd binary, no RDMA device.
        binaries = []
    if host.role == "coordinator":
        fabric = "tcp"
    problems = []
    where = f"host {host.name} ({host.address})"
    status, out, err = host.run(_probe_script(host, fabric, binaries))
    if NO_CHECKOUT in err:
        return [f"{where}: no checkout at repo {host.repo}"]
    # (A login shell may print something of its own first.)
    if status != 0 or not any(line.startswith("checkout ") for line in out.splitlines()):
        reason = (err.strip().splitlines() or [f"exit status {status}"])[-1]
        return [f"{where}: cannot run a command there ({reason})"]
    facts = {}
    for line in out.splitlines():
        key, _, rest = line.partition(" ")
        if key == "binary":
            path, _, digest = rest.partition(" ")
            facts.setdefault("binary", {})[path] = digest
        else:
            facts[key] = rest.split()
    for binary in binaries:
        theirs = facts.get("binary", {}).get(str(binary), "none")
        if theirs == "none":
            problems.append(f"{where}: {binary} is not built in {host.repo} (build it there "
                            f"with the experiment's config)")
        elif theirs != _sha256(pathlib.Path(local_repo) / binary):
            problems.append(f"{where}: {binary} in {host.repo} differs from this machine's "
                            f"build (rebuild it there from the same commit and config)")
    addresses = set(facts.get("addresses", [])) if not host.local else set()
    address = host.address
    if not _is_ip(address):
        try:
            address = socket.gethostbyname(address)
        except OSError:
            problems.append(f"{where}: its address does not resolve here")
            address = None
    if address and addresses and address not in addresses:
        problems.append(f"{where}: {address} is not one of its addresses "
                        f"({' '.join(sorted(addresses))}); its servers would advertise an "
                        f"address that is not theirs")
    if (host.listen_address and host.listen_address not in ("0.0.0.0", "::") and addresses
            and host.listen_address not in addresses):
        problems.append(f"{where}: listen_address {host.listen_address} is not one of its "
                        f"addresses ({' '.join(sorted(addresses))})")
    if fabric == "verbs":
        devices = facts.get("devices", [])
        if not devices:
            problems.append(f"{where}: no RDMA device there (/sys/class/infiniband is empty)")
        elif host.device and host.device not in devices:
            problems.append(f"{where}: no RDMA device {host.device} there (it has: "
                            f"{', '.join(devices)})")
        elif host.device and host.gid_index is not None:
            gid = (facts.get("gid") or ["missing"])[0]
            if gid == "missing":
                problems.append(f"{where}: {host.device} has no GID index {host.gid_index}")
            elif gid == EMPTY_GID:
                problems.append(f"{where}: GID index {host.gid_index} of {host.device} is "
                                f"empty (no address on its netdev at that index)")
    return problems


def share_connections(hosts):
    """From now on each remote host's commands share one ssh connection (OpenSSH's
    ControlMaster): a run makes dozens per host (checks, every process it starts, CPU samples,
    the leftover sweeps), each a full handshake otherwise (~2 s in the cluster box's emulated
    guest, ~0.4 s on its shared connection). Returns the folder of the sockets, for
    close_connections."""
    # Under /tmp whatever TMPDIR says: a unix socket's path must fit in 108 bytes (%C is 40, and
    # ssh adds a 17-byte suffix while it binds).
    directory = tempfile.mkdtemp(prefix="herd-ssh-", dir="/tmp")
    for host in hosts:
        if not host.local:
            host.control_path = os.path.join(directory, "%C")  # a hash: short enough
    return directory


def close_connections(hosts, directory):
    """Ends the shared connections (and with them their sshd sessions on the hosts) and removes
    the folder; commands go back to a connection each. Idempotent; callable from atexit (no
    thread pool: none starts once the interpreter shuts down)."""
    shared = [host for host in hosts if host.control_path]
    closing = [subprocess.Popen(host.ssh_options_argv() + ["-O", "exit", host.ssh_target()],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for host in shared]
    for process in closing:
        try:
            process.wait(timeout=CONTROL_EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()  # the connection ends by itself after CONTROL_PERSIST_S idle
            process.wait()
    for host in shared:
        host.control_path = None
    shutil.rmtree(directory, ignore_errors=True)


def check_hosts(hosts, fabric, binaries, local_repo):
    """Checks every host at once; raises HostError listing every problem found."""
    with futures.ThreadPoolExecutor(max_workers=max(len(hosts), 1)) as pool:
        found = pool.map(lambda h: check_host(h, fabric, binaries, local_repo), hosts)
    problems = [p for per_host in found for p in per_host]
    if problems:
        raise HostError("hosts not ready:\n  " + "\n  ".join(problems))


def _leftover_script(run_id, kill):
    """bash that lists (and with `kill`, SIGKILLs) this run's processes in its own network
    namespace: "PID COMMAND LINE" per line."""
    action = 'kill -KILL "$pid" 2>/dev/null;' if kill else ""
    return (f"mine=$(readlink /proc/self/ns/net); "
            f"for dir in /proc/[0-9]*; do pid=${{dir#/proc/}}; "
            f"[ \"$(readlink $dir/ns/net 2>/dev/null)\" = \"$mine\" ] || continue; "
            f"tr '\\0' '\\n' <$dir/environ 2>/dev/null | grep -qxF {MARKER}={run_id} || continue; "
            # A shared ssh connection (share_connections) is the runner's, not a leftover: its
            # master may have been started by a command that carried the marker.
            f"case \"$(tr '\\0' ' ' <$dir/cmdline 2>/dev/null)\" in 'ssh: '*'[mux]'*) continue;; esac; "
            f"echo \"$pid $(tr '\\0' ' ' <$dir/cmdline 2>/dev/null)\"; {action} done; true")


def leftovers(hosts, run_id, kill=True):
    """({host name: ["PID COMMAND", ...]} of this run's processes still running on each host,
    killed with SIGKILL when `kill`; {host name: why} of the hosts that could not be asked).
    Local hosts share this machine: it is asked once."""
    asked, seen_local = [], False
    for host in hosts:
        if host.local:
            if seen_local:
                continue
            seen_local = True
        asked.append(host)
    found, unasked = {}, {}
    with futures.ThreadPoolExecutor(max_workers=max(len(asked), 1)) as pool:
        answers = pool.map(lambda h: (h, h.run(_leftover_script(run_id, kill))), asked)
        for host, (status, out, err) in answers:
            if status != 0:
                unasked[host.name] = (err.strip().splitlines() or [f"exit status {status}"])[-1]
            elif out.strip():
                found[host.name] = out.strip().splitlines()
    return found, unasked
