// A TCP forwarder on loopback that a test can cut and heal: the TCP half of a network partition
// (the shm fabric's PartitionTable is the RDMA half). Cut, it forwards nothing in either
// direction on the connections it carries (their bytes wait, as on a partitioned network, until
// the heal or until an end gives up) and closes every new connection at once, as an unreachable
// host's connect fails. One thread; nothing of it runs in the processes it connects.
//
//   TcpProxy proxy("127.0.0.1", zookeeper_port);
//   server flag: --coordinator=127.0.0.1:<proxy.port()>
//   proxy.Cut();  ...  proxy.Heal();
#ifndef HERD_TESTS_HERD_TCP_PROXY_H_
#define HERD_TESTS_HERD_TCP_PROXY_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace herd::testing {

class TcpProxy {
 public:
  // Listens on 127.0.0.1 (an ephemeral port) and forwards to host:port (IPv4).
  TcpProxy(std::string host, uint16_t target_port);
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  const absl::Status& status() const { return status_; }
  uint16_t port() const { return port_; }
  void Cut() { Set(true); }
  void Heal() { Set(false); }
  bool cut() const { return cut_.load(); }

 private:
  void Set(bool cut);
  void Run();
  std::string host_;
  uint16_t target_port_;
  absl::Status status_;
  uint16_t port_ = 0;
  int listener_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: Set and the destructor wake the thread's poll
  std::atomic<bool> cut_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A TCP port on 127.0.0.1 that nothing listened on a moment ago (bound and released): for a
// server whose address must be known before it starts.
uint16_t UnusedPort();

}  // namespace herd::testing

#endif  // HERD_TESTS_HERD_TCP_PROXY_H_
