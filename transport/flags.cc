#include "transport/flags.h"

#include "absl/strings/str_format.h"
#include "gflags/gflags.h"

DEFINE_string(fabric, "shm", "shm (the shared-memory fabric, one machine) or verbs (libibverbs)");
DEFINE_string(device, "", "verbs: the device to open (e.g. mlx5_0, rxe0); default the first");
DEFINE_string(shm_fabric_name, "herd",
              "shm: processes see each other only under the same name (isolates runs)");
DEFINE_uint32(mtu, 4096, "Path MTU in bytes: the largest UD message");
DEFINE_uint32(ib_port, 1, "verbs: the port of the device");
DEFINE_int32(gid_index, -1,
             "verbs: GID index (-1: the first RoCE v2 GID with an IPv4 address; IB: LID routing)");
DEFINE_double(inject_ud_loss, 0, "shm: probability that a UD SEND is lost (fault injection)");
DEFINE_double(inject_uc_loss, 0, "shm: probability that a UC WRITE/SEND is lost");
DEFINE_double(inject_write_disorder, 0,
              "shm: probability that a WRITE lands its 8-byte words out of order and then some of "
              "them (always the last) again, as Soft-RoCE may (implies --shm_async)");
DEFINE_uint32(inject_delay_us, 0,
              "shm: every send WR takes effect this long after its post (implies --shm_async)");
DEFINE_uint32(inject_delay_jitter_us, 0,
              "shm: every post_send waits a further random 0..N us (per QP, in order), so QPs "
              "posted to together land at different times (implies --shm_async)");
DEFINE_uint32(inject_slow_read_us, 0,
              "shm: a READ copies its bytes in pieces with this pause between them, so the "
              "responder's memory can change under it (implies --shm_async)");
DEFINE_string(shm_partition_file, "",
              "shm: obey the partition table in this file (created if missing): WRs between "
              "processes cut apart there are lost (`shm_partition` cuts and heals)");
DEFINE_bool(shm_async, false,
            "shm: execute send WRs on a progress thread after PostSend returns, as a NIC does");

DEFINE_string(hugepages, "auto",
              "Pages of the large registered regions (request region, response staging): auto "
              "(2 MiB hugepages when the pool has them, else 4 KiB, logged), required or off");

DEFINE_string(connect, "tcp",
              "How clients join servers: tcp (the TCP control plane) or cm (RDMA-CM: the server's "
              "address and port on its RDMA interface, no TCP; verbs devices only)");

namespace transport {

absl::StatusOr<ConnectMode> ConnectModeFromFlags() {
  if (FLAGS_connect == "tcp") return ConnectMode::kTcp;
  if (FLAGS_connect == "cm") {
    if (FLAGS_fabric == "shm") {
      return absl::InvalidArgumentError(
          "--connect=cm: RDMA-CM needs a verbs device (--fabric=verbs); the shm fabric joins over "
          "TCP (--connect=tcp)");
    }
    return ConnectMode::kCm;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("--connect=%s: expected tcp or cm", FLAGS_connect));
}

absl::StatusOr<PagePolicy> PagePolicyFromFlags() { return ParsePagePolicy(FLAGS_hugepages); }

absl::StatusOr<DeviceOptions> DeviceOptionsFromFlags() {
  DeviceOptions options;
  if (FLAGS_fabric == "shm") {
    options.name = "shm";
  } else if (FLAGS_fabric == "verbs") {
    options.name = FLAGS_device;
    if (options.name.empty()) {
      for (const std::string& name : ListDevices()) {
        if (name != "shm") {
          options.name = name;
          break;
        }
      }
    }
    if (options.name.empty()) {
      return absl::NotFoundError(
          "--fabric=verbs: libibverbs finds no RDMA device here (ibv_devices lists them); name "
          "one with --device, or use --fabric=shm");
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrFormat("--fabric=%s: use shm or verbs", FLAGS_fabric));
  }
  if (FLAGS_ib_port < 1 || FLAGS_ib_port > 255) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--ib_port=%d: ports are numbered from 1", FLAGS_ib_port));
  }
  options.fabric = FLAGS_shm_fabric_name;
  options.mtu = FLAGS_mtu;
  options.port = static_cast<uint8_t>(FLAGS_ib_port);
  options.gid_index = FLAGS_gid_index;
  options.faults.ud_loss = FLAGS_inject_ud_loss;
  options.faults.uc_loss = FLAGS_inject_uc_loss;
  options.faults.delay_us = FLAGS_inject_delay_us;
  options.faults.delay_jitter_us = FLAGS_inject_delay_jitter_us;
  options.faults.write_disorder = FLAGS_inject_write_disorder;
  options.faults.slow_read_us = FLAGS_inject_slow_read_us;
  options.faults.partition_file = FLAGS_shm_partition_file;
  options.shm_async = FLAGS_shm_async;
  return options;
}

}  // namespace transport
