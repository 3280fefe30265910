#!/usr/bin/python3
"""Tests of scripts/rxe_vm.sh's boots: a guest whose kernel stops before it runs the command (a
panic while booting, which TCG guests meet rarely) is booted once more, and only then reported;
a guest that ran the command is never booted again, whatever became of it; a command's exit
status comes back as it was. Each case boots the real guest (about 5-10 s a boot).

usage: tests/scripts/rxe_vm_test.py [-v]
"""
import os
import pathlib
import subprocess
import unittest

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
SCRIPT = str(REPO / "scripts" / "rxe_vm.sh")
# Two boots under TCG on a loaded 2-core machine, with room to spare; the guest's own limit is
# below it so that a hang is reported by the script, not by this test.
BUDGET_S = 400
GUEST_TIMEOUT_S = 150
AGAIN = "booting it again"


def boot(command, **env):
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith("HERD_VM_") or k == "HERD_VM_CACHE"}
    environment.update(HERD_VM_TIMEOUT=str(GUEST_TIMEOUT_S), **env)
    return subprocess.run([SCRIPT, *command], capture_output=True, text=True, env=environment,
                          timeout=BUDGET_S, cwd=REPO)


class RxeVmBootTest(unittest.TestCase):
    def test_a_kernel_that_stops_before_the_command_is_booted_once_more(self):
        # No init in the initramfs by that name: the kernel panics before /init, every boot.
        done = boot(["true"], HERD_VM_APPEND="rdinit=/nonexistent")
        self.assertEqual(done.returncode, 125, done.stderr[-2000:])
        self.assertEqual(done.stderr.count(AGAIN), 1, done.stderr[-2000:])
        self.assertIn("stopped before it ran the command, in 2 boots", done.stderr)
        self.assertIn("Kernel panic", done.stderr)  # the console's tail is shown

    def test_boots_are_bounded_by_herd_vm_boots(self):
        done = boot(["true"], HERD_VM_APPEND="rdinit=/nonexistent", HERD_VM_BOOTS="1")
        self.assertEqual(done.returncode, 125, done.stderr[-2000:])
        self.assertNotIn(AGAIN, done.stderr)
        self.assertIn("in 1 boots", done.stderr)

    def test_a_bad_boot_count_is_refused(self):
        for bad in ("0", "x", "-1"):
            with self.subTest(boots=bad):
                done = boot(["true"], HERD_VM_BOOTS=bad)
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertIn("HERD_VM_BOOTS", done.stderr)

    def test_a_guest_that_dies_in_the_command_is_not_booted_again(self):
        # The command crashes the guest's kernel: the command ran, so that is its verdict.
        done = boot(["sh", "-c", "echo c > /proc/sysrq-trigger"])
        self.assertEqual(done.returncode, 125, done.stderr[-2000:])
        self.assertNotIn(AGAIN, done.stderr)
        self.assertIn("the command gave no exit status", done.stderr)

    def test_a_command_s_exit_status_comes_back(self):
        done = boot(["sh", "-c", "echo out; exit 7"])
        self.assertEqual(done.returncode, 7, done.stderr[-2000:])
        self.assertIn("out", done.stdout)
        self.assertNotIn(AGAIN, done.stderr)


if __name__ == "__main__":
    unittest.main()
