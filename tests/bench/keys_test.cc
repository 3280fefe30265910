// bench::MakeKey writes the bytes its definition says, at every length: tools that preload a
// server and tools that read it back (herd_client, mica_bench, hop_client, replication_bench)
// must agree on every key.
#include "bench/keys.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace bench {
namespace {

// The definition, byte by byte.
std::string DefinedKey(uint64_t index, uint32_t key_bytes) {
  std::string key(key_bytes, '\0');
  for (uint32_t i = 0; i < key_bytes; ++i) {
    const auto index_byte = static_cast<uint8_t>(index >> ((i % 8) * 8));
    key[i] = static_cast<char>(i < 8 ? index_byte : index_byte ^ static_cast<uint8_t>(i * 0x9d));
  }
  return key;
}

TEST(KeysTest, MakeKeyWritesTheDefinedBytesAtEveryLength) {
  const uint64_t indices[] = {0, 1, 255, 256, 0x0123456789abcdefULL, ~uint64_t{0}, 99999};
  for (uint32_t key_bytes = 1; key_bytes <= 300; ++key_bytes) {
    for (uint64_t index : indices) {
      std::string key(key_bytes + 1, '\x5a');  // one guard byte past the key
      MakeKey(index, key_bytes, key.data());
      ASSERT_EQ(key.substr(0, key_bytes), DefinedKey(index, key_bytes))
          << "index " << index << ", " << key_bytes << " bytes";
      ASSERT_EQ(key.back(), '\x5a') << "wrote past " << key_bytes << " bytes";
    }
  }
}

}  // namespace
}  // namespace bench
