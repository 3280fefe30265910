// Pinning threads to cores with hwloc. A server's workers each get a core of their own: the
// cores listed with --worker_cores, else the cores of the NIC's NUMA node (the shm fabric and a
// device without NUMA information use every core), in order.
#ifndef HERD_HERD_PINNING_H_
#define HERD_HERD_PINNING_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace herd {

class Topology {
 public:
  static absl::StatusOr<std::unique_ptr<Topology>> Load();
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  int cores() const;
  // Cores for `count` workers: parsed from `listed` ("0,2,4-7") when not empty, else those of
  // `numa_node` (-1: any). More workers than cores is an error: spinning workers that share a
  // core make every measurement meaningless.
  absl::StatusOr<std::vector<int>> PickCores(uint32_t count, std::string_view listed,
                                             int numa_node) const;
  // The cores of `numa_node` (-1 or unknown: every core), in order.
  std::vector<int> CoresOf(int numa_node) const;
  // Cores for `count` client threads. `spec`: "none" (empty: not pinned), "auto" (the LAST
  // `count` cores of `numa_node`, so that on one machine they stay clear of a server's workers,
  // which take the first ones), or a list as for PickCores.
  absl::StatusOr<std::vector<int>> PickClientCores(uint32_t count, std::string_view spec,
                                                   int numa_node) const;
  // Binds the calling thread to logical core `core` (hwloc core index).
  absl::Status PinCurrentThread(int core) const;

 private:
  explicit Topology(void* topology) : topology_(topology) {}
  void* topology_;  // hwloc_topology_t
};

// Binds the calling thread to `core` (an hwloc core index) checked against this machine; a
// negative core leaves it unpinned. The one way herd's binaries and baselines pin a thread.
absl::Status PinCallingThreadTo(int core);

// NUMA node of a verbs device from sysfs, or -1 when unknown (and always for "shm").
int DeviceNumaNode(std::string_view device);

}  // namespace herd

#endif  // HERD_HERD_PINNING_H_
