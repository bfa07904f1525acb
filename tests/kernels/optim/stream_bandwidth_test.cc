// The bandwidth probes do exactly their contract on awkward buffers (every start alignment mod 16,
// lengths that end mid-word and span several 1 MiB tiles), against a byte-by-byte reference: the read
// is the XOR of every byte, the non-temporal write sets every byte of its range and none outside it,
// the copy is memcpy's result, the in-place update XORs every byte of its range and none outside it.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/optim/stream_bandwidth.h"

namespace slidedp::kernels {
namespace {

std::vector<unsigned char> random_bytes(std::size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

const int64_t kLengths[] = {0, 1, 15, 64, 1000, (int64_t{3} << 20) + 13};

TEST(StreamBandwidth, ReadIsTheXorOfEveryByte) {
  ThreadPool pool(2);
  const auto buf = random_bytes((size_t{3} << 20) + 64, 1);
  for (int offset = 0; offset < 16; ++offset)
    for (int64_t n : kLengths) {
      unsigned char want = 0;
      for (int64_t i = 0; i < n; ++i) want ^= buf[static_cast<std::size_t>(offset + i)];
      EXPECT_EQ(stream_read(pool, buf.data() + offset, n), want) << "offset " << offset << " bytes " << n;
    }
}

TEST(StreamBandwidth, NonTemporalWriteSetsItsRangeAndNothingElse) {
  ThreadPool pool(2);
  for (int offset = 0; offset < 16; offset += 3)
    for (int64_t n : kLengths) {
      std::vector<unsigned char> buf(static_cast<std::size_t>(n) + 48, 0x11);
      stream_write_nontemporal(pool, buf.data() + offset, n, 0xA5);
      for (std::size_t i = 0; i < buf.size(); ++i) {
        const bool inside = static_cast<int64_t>(i) >= offset && static_cast<int64_t>(i) < offset + n;
        ASSERT_EQ(buf[i], inside ? 0xA5 : 0x11) << "byte " << i << " offset " << offset << " bytes " << n;
      }
    }
}

TEST(StreamBandwidth, CopyEqualsMemcpy) {
  ThreadPool pool(2);
  const auto src = random_bytes((size_t{3} << 20) + 64, 2);
  // Source and destination misaligned differently: the streaming stores align on the destination.
  for (auto [to, from] : {std::pair{5, 3}, std::pair{0, 7}, std::pair{16, 0}, std::pair{9, 9}})
    for (int64_t n : kLengths) {
      std::vector<unsigned char> got(src.size(), 0), want(src.size(), 0);
      stream_copy(pool, got.data() + to, src.data() + from, n);
      std::memcpy(want.data() + to, src.data() + from, static_cast<std::size_t>(n));
      EXPECT_EQ(got, want) << n << " bytes, to +" << to << " from +" << from;
    }
}

TEST(StreamBandwidth, UpdateXorsItsRangeInPlaceAndNothingElse) {
  ThreadPool pool(2);
  const auto src = random_bytes((size_t{3} << 20) + 64, 3);
  for (int offset = 0; offset < 16; ++offset)
    for (int64_t n : kLengths) {
      auto buf = src;
      stream_update(pool, buf.data() + offset, n, 0x5A);
      for (std::size_t i = 0; i < buf.size(); ++i) {
        const bool inside = static_cast<int64_t>(i) >= offset && static_cast<int64_t>(i) < offset + n;
        ASSERT_EQ(buf[i], inside ? (src[i] ^ 0x5A) : src[i]) << "byte " << i << " offset " << offset << " bytes " << n;
      }
    }
}

}  // namespace
}  // namespace slidedp::kernels
