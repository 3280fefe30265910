#include "herd/pinning.h"

#include <hwloc.h>

#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace herd {
namespace {

hwloc_topology_t Handle(void* t) { return static_cast<hwloc_topology_t>(t); }

absl::StatusOr<std::vector<int>> ParseCoreList(std::string_view listed) {
  std::vector<int> cores;
  for (absl::string_view part :
       absl::StrSplit(absl::string_view(listed.data(), listed.size()), ',', absl::SkipEmpty())) {
    const std::vector<absl::string_view> range = absl::StrSplit(part, '-');
    int first = 0, last = 0;
    if (range.size() > 2 || !absl::SimpleAtoi(range[0], &first) ||
        !absl::SimpleAtoi(range.back(), &last) || first < 0 || last < first) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--worker_cores=%s: expected a list like 0,2,4-7", listed));
    }
    for (int core = first; core <= last; ++core) cores.push_back(core);
  }
  return cores;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Topology>> Topology::Load() {
  hwloc_topology_t topology;
  if (hwloc_topology_init(&topology) != 0) return absl::InternalError("hwloc_topology_init");
  if (hwloc_topology_load(topology) != 0) {
    hwloc_topology_destroy(topology);
    return absl::InternalError("hwloc_topology_load failed");
  }
  return std::unique_ptr<Topology>(new Topology(topology));
}

Topology::~Topology() { hwloc_topology_destroy(Handle(topology_)); }

int Topology::cores() const { return hwloc_get_nbobjs_by_type(Handle(topology_), HWLOC_OBJ_CORE); }

absl::StatusOr<std::vector<int>> Topology::PickCores(uint32_t count, std::string_view listed,
                                                     int numa_node) const {
  std::vector<int> candidates;
  if (!listed.empty()) {
    absl::StatusOr<std::vector<int>> parsed = ParseCoreList(listed);
    if (!parsed.ok()) return parsed.status();
    for (int core : *parsed) {
      if (core >= cores()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "the list names core %d; this machine has cores 0..%d", core, cores() - 1));
      }
    }
    candidates = *std::move(parsed);
  } else {
    candidates = CoresOf(numa_node);
  }
  if (candidates.size() < count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d workers need %d cores; %d are available%s (list them with --worker_cores)", count,
        count, candidates.size(), numa_node >= 0 ? " on the NIC's NUMA node" : ""));
  }
  candidates.resize(count);
  return candidates;
}

std::vector<int> Topology::CoresOf(int numa_node) const {
  hwloc_obj_t node = numa_node < 0 ? nullptr
                                   : hwloc_get_obj_by_type(Handle(topology_), HWLOC_OBJ_NUMANODE,
                                                           static_cast<unsigned>(numa_node));
  std::vector<int> cores_of_node;
  for (int i = 0; i < cores(); ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(Handle(topology_), HWLOC_OBJ_CORE, i);
    if (node == nullptr || hwloc_bitmap_intersects(core->cpuset, node->cpuset)) {
      cores_of_node.push_back(i);
    }
  }
  return cores_of_node;
}

absl::StatusOr<std::vector<int>> Topology::PickClientCores(uint32_t count, std::string_view spec,
                                                           int numa_node) const {
  if (spec == "none") return std::vector<int>{};
  if (spec != "auto") {
    absl::StatusOr<std::vector<int>> listed = PickCores(count, spec, numa_node);
    if (!listed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--client_cores=%s: %s", spec, listed.status().message()));
    }
    return listed;
  }
  std::vector<int> node = CoresOf(numa_node);
  if (node.size() < count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d client threads need %d cores to spin on; %d are available (--client_cores=none "
        "leaves them to the scheduler)",
        count, count, node.size()));
  }
  return std::vector<int>(node.end() - count, node.end());
}

absl::Status Topology::PinCurrentThread(int core) const {
  hwloc_obj_t obj =
      hwloc_get_obj_by_type(Handle(topology_), HWLOC_OBJ_CORE, static_cast<unsigned>(core));
  if (obj == nullptr) return absl::InvalidArgumentError(absl::StrFormat("no core %d", core));
  if (hwloc_set_cpubind(Handle(topology_), obj->cpuset, HWLOC_CPUBIND_THREAD) != 0) {
    return absl::InternalError(absl::StrFormat("hwloc could not bind a thread to core %d", core));
  }
  return absl::OkStatus();
}

int DeviceNumaNode(std::string_view device) {
  if (device == "shm") return -1;
  std::ifstream file(absl::StrFormat("/sys/class/infiniband/%s/device/numa_node", device));
  int node = -1;
  if (!(file >> node)) return -1;
  return node;
}

absl::Status PinCallingThreadTo(int core) {
  if (core < 0) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<Topology>> topology = Topology::Load();
  if (!topology.ok()) return topology.status();
  if (core >= (*topology)->cores()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("core %d: this machine has %d cores", core, (*topology)->cores()));
  }
  return (*topology)->PinCurrentThread(core);
}

}  // namespace herd
