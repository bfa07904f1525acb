// The tensor-core attention kernels' tile geometry and shared memory per head_dim, as constants the
// host compiler sees too: tests/kernels/cuda/device_math_test.cc checks them against each GPU
// generation's per-block limit, and attention.cu picks the reference path where a size does not fit.
#pragma once

namespace slidedp::kernels::cuda {

constexpr int kTile = 64;  // query rows and key rows per tile
constexpr int kTcThreads = 128;  // 4 warps x 16 rows
constexpr int align128(int bytes) { return (bytes + 127) / 128 * 128; }

template <int HD>
struct TcDims {
  static constexpr int LDB = HD + 8;     // bf16 q / k / v / dO tiles (elements)
  static constexpr int LDS = kTile + 4;  // fp32 score tiles
  static constexpr int LDP = kTile + 8;  // bf16 probability / dS tiles
  static constexpr int LDO = HD + 4;     // fp32 output accumulator
  static constexpr int kTileBytes = align128(kTile * LDB * 2);
  static constexpr int kScoreBytes = align128(kTile * LDS * 4);
  static constexpr int kProbBytes = align128(kTile * LDP * 2);
  // forward: q, k, v tiles, scores, probabilities, output accumulator
  static constexpr int kFwdBytes = 3 * kTileBytes + kScoreBytes + kProbBytes + align128(kTile * LDO * 4);
  // dq: q, dO, k, v tiles, scores, dP, dS
  static constexpr int kDqBytes = 4 * kTileBytes + 2 * kScoreBytes + kProbBytes;
  // dk/dv: k, v, q, dO tiles, scores^T, dP^T, P^T, dS^T, lse and D of the query tile
  static constexpr int kDkvBytes = 4 * kTileBytes + 2 * kScoreBytes + 2 * kProbBytes + 2 * align128(kTile * 4);
};

// Shared memory one block may opt into (cudaDevAttrMaxSharedMemoryPerBlockOptin), bytes.
inline constexpr int kSharedOptinHopper = 227 * 1024;  // H100, H200
inline constexpr int kSharedOptinAmpere = 163 * 1024;  // A100
inline constexpr int kSharedOptinAda = 99 * 1024;      // RTX 4090, L40S

template <int HD>
constexpr int tc_backward_bytes() {
  return TcDims<HD>::kDqBytes > TcDims<HD>::kDkvBytes ? TcDims<HD>::kDqBytes : TcDims<HD>::kDkvBytes;
}

// What the dispatch relies on: head_dim 64 runs on tensor cores everywhere, 128 on Ampere and Hopper.
static_assert(TcDims<64>::kFwdBytes <= kSharedOptinAda && tc_backward_bytes<64>() <= kSharedOptinAda);
static_assert(TcDims<128>::kFwdBytes <= kSharedOptinAmpere && tc_backward_bytes<128>() <= kSharedOptinAmpere);

}  // namespace slidedp::kernels::cuda
