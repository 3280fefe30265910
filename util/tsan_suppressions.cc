// ThreadSanitizer's suppressions, compiled into every binary that links the transport or the
// coordinator (TSan asks for __tsan_default_suppressions at start). Each entry is a race that is
// the system's design, not a bug; everything else TSan reports fails the test (halt_on_error,
// .bazelrc's tsan config).
#if defined(__SANITIZE_THREAD__)

extern "C" const char* __tsan_default_suppressions() {
  return
      // The shm fabric's emulated NIC. A WRITE lands in memory its owner may be reading, and a
      // READ copies memory its owner may be writing, as a NIC's DMA does on real hardware (where
      // TSan never sees it): the wire protocol's markers and checksums, and the readers'
      // version checks, are what make those races safe, and the tests check them.
      "race:transport::shm::OrderedCopy\n"
      "race:transport::shm::StableLineCopy\n"
      // The worker tests' stand-in for a client's WRITE landing in a request slot (the same DMA).
      "race:herd::worker_test::Harness::Land\n"
      // ZooKeeper's C client (Debian's libzookeeper_mt, not built with TSan) formats endpoints
      // into a static buffer from each handle's threads: its race, in its own logging, not ours.
      "called_from_lib:libzookeeper_mt.so\n";
}

#endif  // __SANITIZE_THREAD__
