// The plain-C++ interface between the kernels (rope.cu, CUDA headers only) and the PyTorch binding (binding.cpp).
//
// Why a seam here: the CPU build of PyTorch ships no CUDA headers of its own, so CI compiles rope.cu with nvcc
// alone; everything that needs torch lives in binding.cpp and talks to the kernels through these structs.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace ropekit {

// Element types, as codes (the kernels are templates; the binding maps torch dtypes to these codes).
enum DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

// Position modes, the same numbers as ropekit.positions.
enum PositionMode : int { kScalarOffset = 0, kSeqOffsets = 1, kPositionIds = 2 };

// A (batch, seq, heads, head_dim) view: its first element and its strides, in elements.
struct TensorView {
  void* data = nullptr;
  int64_t stride[4] = {0, 0, 0, 0};
};

struct RopeArgs {
  // q and k share (batch, seq, head_dim); k may have another head count (GQA/MQA) or be absent (heads_k == 0).
  TensorView q, k, out_q, out_k;
  int dtype = kFloat32;  // of q, k, out_q, out_k
  int64_t batch = 0, seqlen = 0;
  int heads_q = 0, heads_k = 0, head_dim = 0, rotary_dim = 0;

  // cos/sin: a half-width table (table_len, rotary_dim/2) read at each token's position, or (cos_per_token)
  // full-width rows (batch, seq, >= rotary_dim). Strides in elements: (batch, row, column); a table has batch
  // stride 0. cos and sin may differ in dtype and strides.
  const void* cos = nullptr;
  const void* sin = nullptr;
  int cos_dtype = kFloat32, sin_dtype = kFloat32;
  int64_t cos_stride[3] = {0, 0, 0};
  int64_t sin_stride[3] = {0, 0, 0};
  int64_t table_len = 0;
  bool cos_per_token = false;

  // Positions (ignored with cos_per_token): offset + s, offsets[b] + s, or ids[b, s] (strides may be 0).
  int pos_mode = kScalarOffset;
  int64_t position_offset = 0;
  const void* positions = nullptr;
  bool positions_int64 = true;
  int64_t pos_stride[2] = {0, 0};  // (batch, seq), in elements

  bool interleaved = false;  // GPT-J pairs (2i, 2i+1) instead of NeoX halves (i, i + rotary_dim/2)
  bool conjugate = false;    // rotate by -theta (the backward pass)
  bool copy_tail = false;    // out of place with rotary_dim < head_dim: copy channels [rotary_dim, head_dim)

  // Launch shape knobs (0: the defaults, 256 threads a block and at most 512 threads on one token).
  int block_threads_target = 0;
  int row_threads_cap = 0;
};

// What the launcher chose, for logging and for the course.
struct LaunchInfo {
  unsigned grid[3] = {0, 0, 0};
  unsigned block[3] = {0, 0, 0};
  int vectorized = 0;        // 1: 16-byte loads/stores of q/k; 0: the scalar fallback
  int table_vectorized = 0;  // 1: the float32 table is read with float2/float4 loads
  int pairs_per_thread = 0;  // pairs one thread rotates per head
  int chunk_threads = 0;     // threads that share one head (threadIdx.x % chunk_threads)
  int heads_per_pass = 0;    // heads a block works on side by side (threadIdx.x / chunk_threads)
};

// Rotate q and k in one launch on `stream`. Returns the launch's error (cudaSuccess when the launch went through);
// returns cudaSuccess without launching when there is nothing to do.
cudaError_t launch_rope(const RopeArgs& args, cudaStream_t stream, LaunchInfo* info);

// Fill cos/sin (max_positions, rotary_dim/2) float32 tables on the device. Accurate (fast == false): the angle
// p * inv_freq[i] is formed in float64 and cos/sin are evaluated in float64, then rounded once to float32.
// fast == true is the deliberately wrong teaching variant: float32 angle and __sincosf.
// block_size 0 picks the default; any other value is used as is (the tests pass an invalid one on purpose).
cudaError_t launch_cos_sin_table(float* cos, float* sin, int64_t max_positions, int rotary_dim, double base,
                                 bool fast, int block_size, cudaStream_t stream);

}  // namespace ropekit
