// A private ZooKeeper for a test (scripts/zk.sh in a temporary folder): started by the
// constructor, stopped by the destructor; Kill and Start again to test a coordinator restart
// (same port, same data).
#ifndef HERD_TESTS_HERD_ZOOKEEPER_H_
#define HERD_TESTS_HERD_ZOOKEEPER_H_

#include <string>

#include "absl/status/status.h"

namespace herd::testing {

class PrivateZooKeeper {
 public:
  PrivateZooKeeper();  // starts it; ok() says whether it answers
  ~PrivateZooKeeper();
  PrivateZooKeeper(const PrivateZooKeeper&) = delete;
  PrivateZooKeeper& operator=(const PrivateZooKeeper&) = delete;

  const absl::Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }
  const std::string& hosts() const { return hosts_; }  // "127.0.0.1:PORT"
  uint16_t port() const { return static_cast<uint16_t>(std::stoi(port_)); }
  // SIGKILL (its sessions then expire for its clients) and start again on the same port.
  absl::Status Kill();
  absl::Status Start();

 private:
  absl::Status Run(const std::string& verb, std::string* output);
  std::string dir_;
  std::string hosts_;
  std::string port_ = "0";
  absl::Status status_;
};

}  // namespace herd::testing

#endif  // HERD_TESTS_HERD_ZOOKEEPER_H_
