#!/usr/bin/python3
"""Tests of scripts/lib/hugepages.sh against stand-in files for the kernel's pool and meminfo: a
run lends only what is missing (reserved pages are not free), gives back exactly what it lent
(whatever else changed the pool meanwhile), lends nothing when enough is free, and without root
or a writable pool says why and goes on.

usage: tests/scripts/hugepages_test.py [-v]
"""
import os
import pathlib
import subprocess
import tempfile
import unittest

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
HELPER = REPO / "scripts" / "lib" / "hugepages.sh"
BUDGET_S = 30


class HugepagesTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.pool = pathlib.Path(self.dir.name) / "nr_hugepages"
        self.meminfo = pathlib.Path(self.dir.name) / "meminfo"

    def tearDown(self):
        self.dir.cleanup()

    def run_helper(self, total, free, reserved, script, uid_zero=True, read_only=False):
        self.pool.write_text(f"{total}\n")
        if read_only:
            os.chmod(self.pool, 0o444)
        self.meminfo.write_text(f"MemTotal: 1 kB\nHugePages_Total: {total}\n"
                                f"HugePages_Free: {free}\nHugePages_Rsvd: {reserved}\n")
        # `id -u` answers as root or not, whoever runs the test.
        fake_id = "id() { echo %d; }; " % (0 if uid_zero else 1000)
        body = (f"set -euo pipefail; . {HELPER}; {fake_id}"
                f"hugepages_pool={self.pool}; hugepages_meminfo={self.meminfo}; {script}")
        return subprocess.run(["bash", "-c", body], capture_output=True, text=True,
                              timeout=BUDGET_S)

    def test_lends_what_is_missing_and_gives_back_what_it_lent(self):
        # 10 in the pool, 6 free but 2 of them reserved: 4 free, 32 wanted, so 28 are lent. The
        # pool grows by 5 more meanwhile (another run): giving back leaves those.
        done = self.run_helper(10, 6, 2, f'lend_hugepages 32 run; cat {self.pool}; '
                               f'echo $(( $(cat {self.pool}) + 5 )) > {self.pool}; '
                               f'give_back_hugepages; cat {self.pool}; give_back_hugepages; '
                               f'cat {self.pool}')
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.split(), ["38", "15", "15"])
        self.assertIn("run: lent the kernel's pool 28 pages", done.stderr)

    def test_lends_nothing_when_enough_are_free(self):
        done = self.run_helper(40, 40, 0, f"lend_hugepages 32 run; give_back_hugepages; "
                               f"cat {self.pool}")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.split(), ["40"])
        self.assertEqual(done.stderr, "")

    def test_without_root_it_says_so_and_goes_on(self):
        done = self.run_helper(0, 0, 0, f"lend_hugepages 32 run; give_back_hugepages; "
                               f"cat {self.pool}", uid_zero=False)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.split(), ["0"])
        self.assertIn("only root can add more", done.stderr)
        self.assertIn("4 KiB pages", done.stderr)

    def test_a_read_only_pool_is_named(self):
        if os.geteuid() == 0:
            self.skipTest("root writes a read-only file anyway")
        done = self.run_helper(0, 0, 0, "lend_hugepages 32 run", read_only=True)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("is read-only here", done.stderr)


if __name__ == "__main__":
    unittest.main()
