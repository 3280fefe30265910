// Replication tests' shared workload (replication_e2e_test on shm, verbs_e2e_test on a device):
// mutations on the primary checked against a model, and after each, the key read back from every
// backup: an acknowledged write is already there.
#ifndef HERD_TESTS_HERD_REPLICATION_WORKLOAD_H_
#define HERD_TESTS_HERD_REPLICATION_WORKLOAD_H_

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "herd/client.h"
#include "herd/join.h"
#include "herd/server.h"
#include "tests/herd/model_workload.h"  // ModelEntry
#include "tests/herd/server_fixture.h"  // SmallServer

namespace herd::testing {

// The staging ring the tests' gates use (per worker): their batches are a few KiB.
inline constexpr uint64_t kTestStagingBytes = 1 << 20;

// A small server of `role` on the shm fabric `fabric` (replication port picked by the kernel).
inline ServerOptions ReplicatedServer(const std::string& fabric, mica::StoreMode mode,
                                      ReplicationRole role) {
  ServerOptions options = SmallServer(fabric);
  options.store.mode = mode;
  options.store.pool_bytes = 4 << 20;
  options.store.try_hugepages = false;  // both sides round alike
  options.replication.role = role;
  options.replication.listen_address = "127.0.0.1";
  options.replication.port = 0;
  options.replication.gate.staging_bytes = kTestStagingBytes;
  options.replication.connect_timeout = absl::Seconds(10);
  // A backup is dropped for a dead link (tested), not because a loaded machine or a sanitizer
  // slowed one chain past the 500 ms default (the tests of stalls set their own).
  options.replication.gate.stall_timeout = absl::Seconds(10);
  return options;
}

// Polls between two promotion requests while the backup has not yet seen its primary go.
inline constexpr absl::Duration kPromotePollInterval = absl::Milliseconds(1);
inline constexpr int kPromoteAttempts = 5000;

// Promotes the backup at `address` as `herd_admin promote` does, asking again while it still
// sees its (dead) primary attached.
inline absl::StatusOr<std::string> PromoteOnceDetached(const std::string& address) {
  absl::StatusOr<std::string> promoted = RequestPromotion(address, absl::Seconds(10));
  for (int i = 0; i < kPromoteAttempts && !promoted.ok() &&
                  promoted.status().message().find("still attached") != std::string::npos;
       ++i) {
    absl::SleepFor(kPromotePollInterval);
    promoted = RequestPromotion(address, absl::Seconds(10));
  }
  return promoted;
}

// A number in a stats JSON text: "name":N (the first occurrence), or -1 if absent.
inline int64_t JsonNumber(const std::string& json, const std::string& name) {
  const size_t at = json.find(absl::StrCat("\"", name, "\":"));
  if (at == std::string::npos) return -1;
  return std::strtoll(json.c_str() + at + name.size() + 3, nullptr, 10);
}

// One machine-readable line of a failover run (scripts/failover_check.sh): on stdout, and
// appended with one write() to $HERD_FAILOVER_REPORT if set (the forked servers' logs share
// stdout and stderr, and can land in the middle of a line there).
inline void ReportRun(const std::string& line) {
  printf("%s\n", line.c_str());
  fflush(stdout);
  const char* path = getenv("HERD_FAILOVER_REPORT");
  if (path == nullptr) return;
  const std::string whole = line + "\n";
  const int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return;
  (void)!write(fd, whole.data(), whole.size());
  close(fd);
}

// A GET at a backup may be answered BACKUP_BUSY (replica_reader.h): writes landing, or the key's
// newest write not yet under the primary's released watermark, which moves once per replication
// round trip. Asked again until this deadline, not a number of times: on a loaded machine (the
// ThreadSanitizer stage) a primary's worker can sit unscheduled for longer than a hundred quick
// GETs take, and the watermark waits for it.
inline constexpr absl::Duration kBusyDeadline = absl::Seconds(20);

inline std::string KeyName(uint32_t k) { return absl::StrFormat("rk%03d", k); }

// A GET at a backup, asked again while it answers BACKUP_BUSY.
inline absl::StatusOr<Value> BackupGet(Client& backup, std::string_view key) {
  const absl::Time give_up = absl::Now() + kBusyDeadline;
  absl::StatusOr<Value> got = backup.Get(key);
  while (absl::IsUnavailable(got.status()) && absl::Now() < give_up) got = backup.Get(key);
  return got;
}

// Every backup holds `model` exactly (each key's value and version, or its absence).
inline void ExpectBackupsHold(const std::vector<std::unique_ptr<Client>>& backups,
                              const std::vector<ModelEntry>& model, const std::string& when) {
  for (size_t b = 0; b < backups.size(); ++b) {
    for (uint32_t k = 0; k < model.size(); ++k) {
      const absl::StatusOr<Value> got = BackupGet(*backups[b], KeyName(k));
      if (model[k].present) {
        ASSERT_TRUE(got.ok()) << when << ": backup " << b << " " << KeyName(k) << ": "
                              << got.status();
        ASSERT_EQ(got->value, model[k].value) << when << ": backup " << b << " " << KeyName(k);
        ASSERT_EQ(got->version, model[k].version) << when << ": backup " << b << " " << KeyName(k);
      } else {
        ASSERT_TRUE(absl::IsNotFound(got.status()))
            << when << ": backup " << b << " " << KeyName(k) << ": "
            << (got.ok() ? absl::StrCat("found version ", got->version) : got.status().ToString());
      }
    }
  }
}

// Random mutations on the primary, each checked against the model, and after each one that
// changed something, the key read back from every backup: acknowledged means held there.
inline void MutateAndCheck(Client& primary, const std::vector<std::unique_ptr<Client>>& backups,
                           std::vector<ModelEntry>& model, uint32_t ops, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const uint32_t max_value = std::min<uint32_t>(primary.config().slot_value_bytes(), 160);
  for (uint32_t i = 0; i < ops; ++i) {
    const uint32_t k = static_cast<uint32_t>(rng() % model.size());
    ModelEntry& m = model[k];
    const std::string value(rng() % (max_value + 1), static_cast<char>('a' + rng() % 26));
    const uint32_t dice = static_cast<uint32_t>(rng() % 10);
    if (dice < 5) {
      absl::StatusOr<uint64_t> put = primary.Put(KeyName(k), value);
      ASSERT_TRUE(put.ok()) << put.status();
      ASSERT_GT(*put, m.version);
      m = ModelEntry{true, value, *put};
    } else if (dice < 7) {
      absl::StatusOr<uint64_t> del = primary.Delete(KeyName(k));
      ASSERT_EQ(del.ok(), m.present) << del.status();
      if (del.ok()) m = ModelEntry{false, "", *del};
    } else {
      const bool right = rng() % 2 == 0;
      absl::StatusOr<uint64_t> cas =
          primary.Cas(KeyName(k), right ? m.version : m.version + 1, value);
      if (m.present && right) {
        ASSERT_TRUE(cas.ok()) << cas.status();
        m = ModelEntry{true, value, *cas};
      } else {
        ASSERT_FALSE(cas.ok());
      }
    }
    // The write is acknowledged: every backup answers it now.
    for (size_t b = 0; b < backups.size(); ++b) {
      const absl::StatusOr<Value> got = BackupGet(*backups[b], KeyName(k));
      if (m.present) {
        ASSERT_TRUE(got.ok()) << "op " << i << " backup " << b << ": " << got.status();
        ASSERT_EQ(got->value, m.value) << "op " << i << " backup " << b;
        ASSERT_EQ(got->version, m.version) << "op " << i << " backup " << b;
      } else {
        ASSERT_TRUE(absl::IsNotFound(got.status()))
            << "op " << i << " backup " << b << ": "
            << (got.ok() ? absl::StrCat("found version ", got->version) : got.status().ToString());
      }
    }
  }
}

}  // namespace herd::testing

#endif  // HERD_TESTS_HERD_REPLICATION_WORKLOAD_H_
