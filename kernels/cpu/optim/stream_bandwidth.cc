// Host-memory bandwidth probes; see stream_bandwidth.h.
#include "kernels/cpu/optim/stream_bandwidth.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define SLIDEDP_STREAM_SSE2 1
#else
#define SLIDEDP_STREAM_SSE2 0
#endif

namespace slidedp::kernels {
namespace {

// Streams per thread: one core's bandwidth is bound by the misses it keeps in flight, and the
// optimizer kernels read up to seven arrays at once (the fused reduce + AdamW); with four streams
// the single-thread read probe ran below AdamW's own reads on the development VM.
constexpr int kStreams = 8;

// XOR of the 64-bit words of [p, p + bytes), the ragged ends byte by byte; every byte lands in one
// byte lane of the result, so folding the lanes (fold_bytes) gives the XOR of all bytes.
uint64_t read_tail(const std::byte* p, int64_t bytes) {
  uint64_t acc = 0;
  int64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    acc ^= w;
  }
  for (; i < bytes; ++i) acc ^= static_cast<uint64_t>(p[i]);
  return acc;
}

uint64_t read_tile(const std::byte* p, int64_t bytes) {
  uint64_t acc = 0;
  int64_t done = 0;
#if SLIDEDP_STREAM_SSE2
  // kStreams streams at once, a cache line of each per iteration.
  const auto head = static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16);
  acc ^= read_tail(p, std::min(head, bytes));
  done = std::min(head, bytes);
  const int64_t part = (bytes - done) / kStreams / 64 * 64;
  if (part > 0) {
    __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < part; i += 64)
      for (int k = 0; k < kStreams; ++k) {
        const std::byte* s = p + done + k * part;
        const auto* v = reinterpret_cast<const __m128i*>(s + i);
        a0 = _mm_xor_si128(a0, _mm_load_si128(v));
        a1 = _mm_xor_si128(a1, _mm_load_si128(v + 1));
        a2 = _mm_xor_si128(a2, _mm_load_si128(v + 2));
        a3 = _mm_xor_si128(a3, _mm_load_si128(v + 3));
      }
    alignas(16) uint64_t lanes[2];
    _mm_store_si128(reinterpret_cast<__m128i*>(lanes), _mm_xor_si128(_mm_xor_si128(a0, a1), _mm_xor_si128(a2, a3)));
    acc ^= lanes[0] ^ lanes[1];
    done += kStreams * part;
  }
#endif
  return acc ^ read_tail(p + done, bytes - done);
}

void write_tile(std::byte* p, int64_t bytes, unsigned char value) {
  int64_t i = 0;
#if SLIDEDP_STREAM_SSE2
  const auto head = static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16);
  for (; i < head && i < bytes; ++i) p[i] = static_cast<std::byte>(value);
  const __m128i v = _mm_set1_epi8(static_cast<char>(value));
  for (; i + 64 <= bytes; i += 64) {
    auto* q = reinterpret_cast<__m128i*>(p + i);
    _mm_stream_si128(q, v);
    _mm_stream_si128(q + 1, v);
    _mm_stream_si128(q + 2, v);
    _mm_stream_si128(q + 3, v);
  }
  _mm_sfence();  // the streaming stores are weakly ordered: make them visible before returning
#endif
  for (; i < bytes; ++i) p[i] = static_cast<std::byte>(value);
}

// dst[0, bytes) = src[0, bytes): the read probe's four load streams, the write probe's non-temporal
// stores. memcpy is not the bound here: it may pay a read for ownership of every destination line
// (or not, with `rep movsb`), and on some machines runs below what the optimizer kernels move.
void copy_tile(std::byte* d, const std::byte* s, int64_t bytes) {
  int64_t done = 0;
#if SLIDEDP_STREAM_SSE2
  // The destination decides alignment (streaming stores need it); loads are unaligned-safe.
  const auto head = std::min(static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(d) % 16) % 16), bytes);
  std::memcpy(d, s, static_cast<std::size_t>(head));
  done = head;
  const int64_t part = (bytes - done) / kStreams / 64 * 64;
  if (part > 0) {
    for (int64_t i = 0; i < part; i += 64)
      for (int k = 0; k < kStreams; ++k) {
        const auto* from = reinterpret_cast<const __m128i*>(s + done + k * part + i);
        auto* to = reinterpret_cast<__m128i*>(d + done + k * part + i);
        const __m128i v0 = _mm_loadu_si128(from), v1 = _mm_loadu_si128(from + 1);
        const __m128i v2 = _mm_loadu_si128(from + 2), v3 = _mm_loadu_si128(from + 3);
        _mm_stream_si128(to, v0);
        _mm_stream_si128(to + 1, v1);
        _mm_stream_si128(to + 2, v2);
        _mm_stream_si128(to + 3, v3);
      }
    _mm_sfence();
    done += kStreams * part;
  }
#endif
  std::memcpy(d + done, s + done, static_cast<std::size_t>(bytes - done));
}

// Every byte of [p, p + bytes) XORed with `value` in place, with ordinary loads and stores: the
// pattern of AdamW, which writes p, m and v back to the lines it has just read.
void update_tile(std::byte* p, int64_t bytes, unsigned char value) {
  int64_t done = 0;
#if SLIDEDP_STREAM_SSE2
  const auto head = std::min(static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(p) % 16) % 16), bytes);
  for (; done < head; ++done) p[done] ^= static_cast<std::byte>(value);
  const int64_t part = (bytes - done) / kStreams / 64 * 64;
  if (part > 0) {
    const __m128i x = _mm_set1_epi8(static_cast<char>(value));
    for (int64_t i = 0; i < part; i += 64)
      for (int k = 0; k < kStreams; ++k) {
        auto* q = reinterpret_cast<__m128i*>(p + done + k * part + i);
        _mm_store_si128(q, _mm_xor_si128(_mm_load_si128(q), x));
        _mm_store_si128(q + 1, _mm_xor_si128(_mm_load_si128(q + 1), x));
        _mm_store_si128(q + 2, _mm_xor_si128(_mm_load_si128(q + 2), x));
        _mm_store_si128(q + 3, _mm_xor_si128(_mm_load_si128(q + 3), x));
      }
    done += kStreams * part;
  }
#endif
  for (; done < bytes; ++done) p[done] ^= static_cast<std::byte>(value);
}

unsigned char fold_bytes(uint64_t x) {
  x ^= x >> 32;
  x ^= x >> 16;
  x ^= x >> 8;
  return static_cast<unsigned char>(x);
}

}  // namespace

unsigned char stream_read(ThreadPool& pool, const void* src, int64_t bytes) {
  const auto* p = static_cast<const std::byte*>(src);
  std::atomic<unsigned> acc{0};
  pool.parallel_for_range(0, bytes, kStreamTileBytes,
                          [&](int64_t b, int64_t e) { acc.fetch_xor(fold_bytes(read_tile(p + b, e - b)), std::memory_order_relaxed); });
  return static_cast<unsigned char>(acc.load());
}

void stream_write_nontemporal(ThreadPool& pool, void* dst, int64_t bytes, unsigned char value) {
  auto* p = static_cast<std::byte*>(dst);
  pool.parallel_for_range(0, bytes, kStreamTileBytes, [&](int64_t b, int64_t e) { write_tile(p + b, e - b, value); });
}

void stream_copy(ThreadPool& pool, void* dst, const void* src, int64_t bytes) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  pool.parallel_for_range(0, bytes, kStreamTileBytes,
                          [&](int64_t b, int64_t e) { copy_tile(d + b, s + b, e - b); });
}

void stream_update(ThreadPool& pool, void* data, int64_t bytes, unsigned char value) {
  auto* p = static_cast<std::byte*>(data);
  pool.parallel_for_range(0, bytes, kStreamTileBytes, [&](int64_t b, int64_t e) { update_tile(p + b, e - b, value); });
}

}  // namespace slidedp::kernels
