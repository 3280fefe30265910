#!/usr/bin/python3
"""Tests of scripts/zk.sh's owner watch (HERD_ZK_OWNER): a test's private ZooKeeper goes when the
test process does, also when the forked shell became java only after the watcher first looked
(a loaded machine: HERD_ZK_EXEC_DELAY_S makes that moment late on purpose; before the fix the
watcher took the server for gone then, and either killed it as it started or, as here, left it
running for ever).

usage: tests/scripts/zk_test.py [-v]
"""
import os
import pathlib
import subprocess
import tempfile
import time
import unittest

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
ZK = REPO / "scripts" / "zk.sh"
# zk.sh waits up to 60 s for a JVM to answer; its watcher looks once a second.
START_BUDGET_S = 90
GONE_BUDGET_S = 30


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (a server this test's process tree has not reaped) is gone too.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(condition, budget_s):
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@unittest.skipUnless(pathlib.Path("/usr/share/java/zookeeper.jar").exists(),
                     "Debian's zookeeper package is missing (scripts/setup.sh installs it)")
class ZkOwnerTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        # The owner: a process this test ends when it chooses.
        self.owner = subprocess.Popen(["sleep", "600"])

    def tearDown(self):
        subprocess.run(["bash", str(ZK), "kill", self.dir.name], capture_output=True)
        self.owner.kill()
        self.owner.wait()
        self.dir.cleanup()

    def start(self, exec_delay_s):
        env = {**os.environ, "HERD_ZK_OWNER": str(self.owner.pid),
               "HERD_ZK_EXEC_DELAY_S": str(exec_delay_s)}
        started = subprocess.run(["bash", str(ZK), "start", self.dir.name], env=env,
                                 capture_output=True, text=True, timeout=START_BUDGET_S)
        self.assertEqual(started.returncode, 0, started.stderr)
        return int(pathlib.Path(self.dir.name, "zk.pid").read_text())

    def check_goes_with_its_owner(self, exec_delay_s):
        pid = self.start(exec_delay_s)
        self.assertTrue(alive(pid), "the server died though its owner lives")
        self.owner.kill()
        self.owner.wait()
        self.assertTrue(wait_until(lambda: not alive(pid), GONE_BUDGET_S),
                        f"the server (pid {pid}) outlived its owner by {GONE_BUDGET_S} s")

    def test_goes_with_its_owner(self):
        self.check_goes_with_its_owner(0)

    def test_goes_with_its_owner_when_java_started_late(self):
        self.check_goes_with_its_owner(2)


if __name__ == "__main__":
    unittest.main()
