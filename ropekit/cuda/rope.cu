// ropekit's CUDA C++ RoPE kernels: the same contract as Triton v4 (ropekit/triton/v4.py), written by hand.
//
// This file includes CUDA headers only (no torch), so that `nvcc -c -arch=sm_90 rope.cu` compiles it on a machine
// whose PyTorch is a CPU build (CI does exactly that). The PyTorch side lives in binding.cpp; rope.h is the seam.
//
// Thread/block mapping (Triton's program = one tile of tokens x heads; here it is spelled out per thread):
//
//   grid.x   token blocks: blockDim.y tokens of one sequence each
//   grid.y   sequences (batch); a grid-stride loop covers batches beyond 65535
//   thread   threadIdx.y picks the token, threadIdx.x = head_slot * chunk_threads + chunk_slot:
//            chunk_slot picks a group of P pairs of the head, head_slot a head among heads_per_pass; threads loop
//            over the remaining heads of q then of k (one launch for both, any head counts: GQA/MQA).
//
// A thread loads the cos/sin of its P pairs once per token and reuses them for every head it visits: the same
// reuse Triton v4 gets by broadcasting a [BLOCK_S, BLOCK_HALF] cos tile over BLOCK_H heads.
//
// Memory: when head_dim is contiguous and every base pointer and stride allows it, each thread moves 16 bytes per
// access (8 bf16/fp16, 4 fp32, 2 fp64): NeoX reads one vector from each half of the rotary channels, GPT-J one
// vector of neighbouring pairs. Consecutive threads read consecutive vectors, so a warp reads whole 128-byte lines.
// Otherwise the same threads fall back to element-wise loads through the strides (any layout, any alignment).
//
// Math: fp16/bf16/fp32 inputs are turned in fp32, fp64 in fp64, and rounded once to the output dtype. The fused
// multiply-adds are written out (not left to the compiler's contraction) so the rounding is the one chosen here:
// out_a = fma(x_a, cos, -(x_b * sin)), out_b = fma(x_a, sin, x_b * cos) -- the form Triton's compiler produced for v4.

#include <cstdint>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "rope.h"

namespace ropekit {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Element types: storage type T, math type Math, and the conversions (explicit intrinsics: PyTorch builds with the
// implicit half/bfloat16 conversions switched off).
// ---------------------------------------------------------------------------------------------------------------

template <typename T>
struct Elem;

template <>
struct Elem<float> {
  using Math = float;
  static __device__ __forceinline__ float to_math(float x) { return x; }
  static __device__ __forceinline__ float from_math(float x) { return x; }
};

template <>
struct Elem<double> {
  using Math = double;
  static __device__ __forceinline__ double to_math(double x) { return x; }
  static __device__ __forceinline__ double from_math(double x) { return x; }
};

template <>
struct Elem<__half> {
  using Math = float;
  static __device__ __forceinline__ float to_math(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_math(float x) { return __float2half_rn(x); }
};

template <>
struct Elem<__nv_bfloat16> {
  using Math = float;
  static __device__ __forceinline__ float to_math(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_math(float x) { return __float2bfloat16_rn(x); }
};

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) { return __fma_rn(a, b, c); }

template <typename M>
__device__ __forceinline__ M quiet_nan();
template <>
__device__ __forceinline__ float quiet_nan<float>() { return __int_as_float(0x7fc00000); }
template <>
__device__ __forceinline__ double quiet_nan<double>() { return __longlong_as_double(0x7ff8000000000000LL); }

// cos/sin of any float dtype, element i, converted to the math type (read-only data: the read-only cache path).
template <typename M>
__device__ __forceinline__ M load_as(const void* base, int64_t i, int dtype) {
  switch (dtype) {
    case kFloat16: return static_cast<M>(__half2float(__ldg(static_cast<const __half*>(base) + i)));
    case kBFloat16: return static_cast<M>(__bfloat162float(__ldg(static_cast<const __nv_bfloat16*>(base) + i)));
    case kFloat64: return static_cast<M>(__ldg(static_cast<const double*>(base) + i));
    default: return static_cast<M>(__ldg(static_cast<const float*>(base) + i));
  }
}

__device__ __forceinline__ int64_t load_position(const void* base, int64_t i, bool is_int64) {
  return is_int64 ? static_cast<int64_t>(__ldg(static_cast<const long long*>(base) + i))
                  : static_cast<int64_t>(__ldg(static_cast<const int*>(base) + i));
}

// 16-byte vector access. q/k use plain (coherent) loads, not __ldg: in place, the kernel writes what it reads.
template <typename T, int N>
__device__ __forceinline__ void load16(const T* p, T (&v)[N]) {
  static_assert(sizeof(T) * N == 16, "a vector is 16 bytes");
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  memcpy(v, &raw, 16);
}

template <typename T, int N>
__device__ __forceinline__ void store16(T* p, const T (&v)[N]) {
  static_assert(sizeof(T) * N == 16, "a vector is 16 bytes");
  uint4 raw;
  memcpy(&raw, v, 16);
  *reinterpret_cast<uint4*>(p) = raw;
}

// P consecutive floats of a float32 table row with the widest aligned loads (float4, float2 or float).
__host__ __device__ constexpr int table_vector_width(int P) { return P % 4 == 0 ? 4 : (P % 2 == 0 ? 2 : 1); }

template <int P, typename M>
__device__ __forceinline__ void load_table_row(const float* p, M (&v)[P]) {
  constexpr int W = table_vector_width(P);
  if constexpr (W == 4) {
#pragma unroll
    for (int i = 0; i < P / 4; ++i) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(p) + i);
      v[4 * i] = f.x; v[4 * i + 1] = f.y; v[4 * i + 2] = f.z; v[4 * i + 3] = f.w;
    }
  } else if constexpr (W == 2) {
#pragma unroll
    for (int i = 0; i < P / 2; ++i) {
      const float2 f = __ldg(reinterpret_cast<const float2*>(p) + i);
      v[2 * i] = f.x; v[2 * i + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < P; ++i) v[i] = __ldg(p + i);
  }
}

// Where head `head` (q's heads first, then k's) of token (b, s) starts, in the input and in the output. Scalars are
// selected one by one (not a reference to q's or k's view), so the kernel parameters stay in parameter space.
template <typename T>
struct HeadRow {
  const T* x;
  T* out;
  int64_t x_step, out_step;  // head_dim strides
};

template <typename T>
__device__ __forceinline__ HeadRow<T> head_row(const RopeArgs& a, int64_t b, int64_t s, int head) {
  const bool is_q = head < a.heads_q;
  const int64_t h = is_q ? head : head - a.heads_q;
  const int64_t x_off = b * (is_q ? a.q.stride[0] : a.k.stride[0]) + s * (is_q ? a.q.stride[1] : a.k.stride[1]) +
                        h * (is_q ? a.q.stride[2] : a.k.stride[2]);
  const int64_t o_off = b * (is_q ? a.out_q.stride[0] : a.out_k.stride[0]) +
                        s * (is_q ? a.out_q.stride[1] : a.out_k.stride[1]) +
                        h * (is_q ? a.out_q.stride[2] : a.out_k.stride[2]);
  HeadRow<T> r;
  r.x = static_cast<const T*>(is_q ? a.q.data : a.k.data) + x_off;
  r.out = static_cast<T*>(is_q ? a.out_q.data : a.out_k.data) + o_off;
  r.x_step = is_q ? a.q.stride[3] : a.k.stride[3];
  r.out_step = is_q ? a.out_q.stride[3] : a.out_k.stride[3];
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// The rotation kernel.
//   T            q/k element type
//   INTERLEAVED  GPT-J pairs (2i, 2i+1) rather than NeoX halves (i, i + R/2)
//   VEC          16-byte accesses (the launcher checked alignment); otherwise element-wise through the strides
//   PER_TOKEN    cos/sin rows given per token (full width, any dtype) instead of a table read at each position;
//                a template switch because the per-token path needs twice the cos/sin registers, and sharing the
//                register allocation with it would cost the table path occupancy
// Everything else (position mode, conjugate, tail copy, dtypes of positions and per-token cos/sin) is a uniform
// run-time branch: it costs nothing measurable in a memory-bound kernel and keeps the build small.
// ---------------------------------------------------------------------------------------------------------------

constexpr int kMaxBlockThreads = 512;  // the launcher never asks for more; the register budget assumes it

template <typename T, bool INTERLEAVED, bool VEC, bool PER_TOKEN>
__global__ void __launch_bounds__(kMaxBlockThreads)
    rope_kernel(const RopeArgs a, const int chunk_threads, const int heads_per_pass, const bool table_vec) {
  using M = typename Elem<T>::Math;
  constexpr int L = 16 / static_cast<int>(sizeof(T));  // elements in one 16-byte vector
  constexpr int P = INTERLEAVED ? L / 2 : L;           // pairs a thread turns per head and step

  const int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (s >= a.seqlen) return;
  const int half = a.rotary_dim / 2;
  const int n_chunks = (half + P - 1) / P;
  const int n_heads = a.heads_q + a.heads_k;
  const int chunk_slot = static_cast<int>(threadIdx.x) % chunk_threads;
  const int head_slot = static_cast<int>(threadIdx.x) / chunk_threads;
  const int tail = a.copy_tail ? a.head_dim - a.rotary_dim : 0;
  const int n_tail_chunks = (tail + L - 1) / L;

  for (int64_t b = blockIdx.y; b < a.batch; b += gridDim.y) {
    // --- this token's position (table mode) ---------------------------------------------------------------
    int64_t row = 0;
    bool in_table = true;
    if constexpr (!PER_TOKEN) {
      int64_t position;
      if (a.pos_mode == kScalarOffset) {
        position = a.position_offset + s;
      } else if (a.pos_mode == kSeqOffsets) {
        position = load_position(a.positions, b * a.pos_stride[0], a.positions_int64) + s;
      } else {
        position = load_position(a.positions, b * a.pos_stride[0] + s * a.pos_stride[1], a.positions_int64);
      }
      // Never read outside the table: such a token gets NaN (loud), as in Triton v4.
      in_table = position >= 0 && position < a.table_len;
      row = position;
    }

    for (int chunk = chunk_slot; chunk < n_chunks; chunk += chunk_threads) {
      const int first_pair = chunk * P;
      // --- cos/sin of pairs [first_pair, first_pair + P), shared by every head below -----------------------
      // NeoX pair p turns channels (p, p + R/2), GPT-J pair p channels (2p, 2p + 1). A half-width table has one
      // angle per pair; per-token rows (transformers' layout) are full width, so the two channels of a pair read
      // their own columns (equal for rotate_half tables, but M-RoPE-style rows need not be).
      M cos_a[P], sin_a[P], cos_b[P], sin_b[P];
      if constexpr (PER_TOKEN) {
        const int64_t crow = b * a.cos_stride[0] + s * a.cos_stride[1];
        const int64_t srow = b * a.sin_stride[0] + s * a.sin_stride[1];
#pragma unroll
        for (int j = 0; j < P; ++j) {
          const int p = first_pair + j;
          if (VEC || p < half) {
            const int col_a = INTERLEAVED ? 2 * p : p;
            const int col_b = INTERLEAVED ? 2 * p + 1 : p + half;
            cos_a[j] = load_as<M>(a.cos, crow + col_a * a.cos_stride[2], a.cos_dtype);
            cos_b[j] = load_as<M>(a.cos, crow + col_b * a.cos_stride[2], a.cos_dtype);
            sin_a[j] = load_as<M>(a.sin, srow + col_a * a.sin_stride[2], a.sin_dtype);
            sin_b[j] = load_as<M>(a.sin, srow + col_b * a.sin_stride[2], a.sin_dtype);
          } else {
            cos_a[j] = cos_b[j] = sin_a[j] = sin_b[j] = M(0);
          }
        }
      } else if (!in_table) {
#pragma unroll
        for (int j = 0; j < P; ++j) cos_a[j] = cos_b[j] = sin_a[j] = sin_b[j] = quiet_nan<M>();
      } else if (VEC && table_vec) {
        load_table_row<P>(static_cast<const float*>(a.cos) + row * a.cos_stride[1] + first_pair, cos_a);
        load_table_row<P>(static_cast<const float*>(a.sin) + row * a.sin_stride[1] + first_pair, sin_a);
#pragma unroll
        for (int j = 0; j < P; ++j) { cos_b[j] = cos_a[j]; sin_b[j] = sin_a[j]; }
      } else {
#pragma unroll
        for (int j = 0; j < P; ++j) {
          const int p = first_pair + j;
          if (VEC || p < half) {
            cos_a[j] = load_as<M>(a.cos, row * a.cos_stride[1] + p * a.cos_stride[2], a.cos_dtype);
            sin_a[j] = load_as<M>(a.sin, row * a.sin_stride[1] + p * a.sin_stride[2], a.sin_dtype);
          } else {
            cos_a[j] = sin_a[j] = M(0);
          }
          cos_b[j] = cos_a[j];
          sin_b[j] = sin_a[j];
        }
      }
      if (a.conjugate) {  // rotate by -theta: the inverse rotation, i.e. the backward pass
#pragma unroll
        for (int j = 0; j < P; ++j) { sin_a[j] = -sin_a[j]; sin_b[j] = -sin_b[j]; }
      }

      // --- every head of q, then of k, that this thread visits --------------------------------------------
      for (int head = head_slot; head < n_heads; head += heads_per_pass) {
        const HeadRow<T> r = head_row<T>(a, b, s, head);
        const T* x = r.x;
        T* out = r.out;
        const int64_t xd = r.x_step, od = r.out_step;

        // All loads of this head before any store: in place, out == x.
        M xa[P], xb[P];
        if constexpr (VEC) {
          if constexpr (INTERLEAVED) {
            T v[L];
            load16(x + 2 * first_pair, v);
#pragma unroll
            for (int j = 0; j < P; ++j) {
              xa[j] = Elem<T>::to_math(v[2 * j]);
              xb[j] = Elem<T>::to_math(v[2 * j + 1]);
            }
          } else {
            T va[L], vb[L];
            load16(x + first_pair, va);
            load16(x + half + first_pair, vb);
#pragma unroll
            for (int j = 0; j < P; ++j) {
              xa[j] = Elem<T>::to_math(va[j]);
              xb[j] = Elem<T>::to_math(vb[j]);
            }
          }
        } else {
#pragma unroll
          for (int j = 0; j < P; ++j) {
            const int p = first_pair + j;
            if (p < half) {
              const int64_t ca = INTERLEAVED ? 2 * p : p;
              const int64_t cb = INTERLEAVED ? 2 * p + 1 : p + half;
              xa[j] = Elem<T>::to_math(x[ca * xd]);
              xb[j] = Elem<T>::to_math(x[cb * xd]);
            } else {
              xa[j] = xb[j] = M(0);
            }
          }
        }

        // Rotate in the math type (fp32, or fp64 for fp64 inputs) and round once to T. The FMAs are explicit:
        // the contraction is chosen here, not left to nvcc.
        T ya[P], yb[P];
#pragma unroll
        for (int j = 0; j < P; ++j) {
          ya[j] = Elem<T>::from_math(fma_rn(xa[j], cos_a[j], -mul_rn(xb[j], sin_a[j])));
          yb[j] = Elem<T>::from_math(fma_rn(xa[j], sin_b[j], mul_rn(xb[j], cos_b[j])));
        }

        // Store, the same way the pairs were loaded.
        if constexpr (VEC) {
          if constexpr (INTERLEAVED) {
            T v[L];
#pragma unroll
            for (int j = 0; j < P; ++j) { v[2 * j] = ya[j]; v[2 * j + 1] = yb[j]; }
            store16(out + 2 * first_pair, v);
          } else {
            store16(out + first_pair, ya);
            store16(out + half + first_pair, yb);
          }
        } else {
#pragma unroll
          for (int j = 0; j < P; ++j) {
            const int p = first_pair + j;
            if (p < half) {
              const int64_t ca = INTERLEAVED ? 2 * p : p;
              const int64_t cb = INTERLEAVED ? 2 * p + 1 : p + half;
              out[ca * od] = ya[j];
              out[cb * od] = yb[j];
            }
          }
        }
      }
    }

    // --- partial rotary out of place: channels [rotary_dim, head_dim) pass through unchanged ---------------
    for (int chunk = chunk_slot; chunk < n_tail_chunks; chunk += chunk_threads) {
      const int first = a.rotary_dim + chunk * L;
      for (int head = head_slot; head < n_heads; head += heads_per_pass) {
        const HeadRow<T> r = head_row<T>(a, b, s, head);
        if (VEC && first + L <= a.head_dim) {
          T v[L];
          load16(r.x + first, v);
          store16(r.out + first, v);
        } else {
          for (int c = first; c < first + L && c < a.head_dim; ++c) r.out[c * r.out_step] = r.x[c * r.x_step];
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The table kernel: cos[p, i] = cos(p * inv_freq[i]), inv_freq[i] = base^(-2i/R), as float32.
//
// Accurate: inv_freq, the angle and cos/sin in float64, rounded once to float32. A float32 angle is not enough: at
// p = 1e6 the float32 grid spacing is 0.0625, so the angle itself is off by up to 0.03 rad before any sin/cos.
// FAST (teaching only, deliberately wrong): float32 angle and __sincosf, the MUFU approximations, whose error also
// grows with |angle| because they do no careful range reduction.
// ---------------------------------------------------------------------------------------------------------------

template <bool FAST>
__global__ void cos_sin_table_kernel(float* __restrict__ cos_out, float* __restrict__ sin_out, int64_t n_positions,
                                     int rotary_dim, double base) {
  const int half = rotary_dim / 2;
  const int64_t total = n_positions * half;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t p = i / half;
    const int pair = static_cast<int>(i - p * half);
    // The same float64 operations as ropekit.frequencies: exponent 2i/R, then base ** -exponent.
    const double inv_freq = pow(base, -(static_cast<double>(2 * pair) / static_cast<double>(rotary_dim)));
    if constexpr (FAST) {
      const float angle = static_cast<float>(p) * static_cast<float>(inv_freq);
      float s, c;
      __sincosf(angle, &s, &c);
      cos_out[i] = c;
      sin_out[i] = s;
    } else {
      const double angle = static_cast<double>(p) * inv_freq;  // exact position: p < 2^53
      double s, c;
      sincos(angle, &s, &c);
      cos_out[i] = __double2float_rn(c);
      sin_out[i] = __double2float_rn(s);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Host side: alignment checks, launch configuration, dispatch.
// ---------------------------------------------------------------------------------------------------------------

// Can this (batch, seq, heads, head_dim) view be read in 16-byte vectors of L elements, starting at any multiple of
// L channels? head_dim must be contiguous and the base and every used stride a multiple of 16 bytes.
bool vector_friendly(const TensorView& t, int64_t batch, int64_t seqlen, int64_t heads, int L) {
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  if (t.stride[3] != 1) return false;
  const int64_t sizes[3] = {batch, seqlen, heads};
  for (int d = 0; d < 3; ++d) {
    if (sizes[d] > 1 && t.stride[d] % L != 0) return false;  // a size-1 axis never moves the pointer
  }
  return true;
}

// Can a float32 table be read with W-float vectors at columns that are multiples of W?
bool table_friendly(const void* base, int dtype, const int64_t (&stride)[3], int64_t rows, int W) {
  if (dtype != kFloat32 || stride[2] != 1) return false;
  if (reinterpret_cast<uintptr_t>(base) % (4 * W) != 0) return false;
  return rows <= 1 || stride[1] % W == 0;
}

// A launch-shape knob: 0 means the default; otherwise kept within [32, kMaxBlockThreads].
int clamp_threads(int requested, int fallback) {
  if (requested <= 0) return fallback;
  return requested < 32 ? 32 : (requested > kMaxBlockThreads ? kMaxBlockThreads : requested);
}

template <typename T, bool INTERLEAVED, bool VEC>
cudaError_t launch_variant(const RopeArgs& a, dim3 grid, dim3 block, int chunk_threads, int heads_per_pass,
                           bool table_vec, cudaStream_t stream) {
  if (a.cos_per_token) {
    rope_kernel<T, INTERLEAVED, VEC, true><<<grid, block, 0, stream>>>(a, chunk_threads, heads_per_pass, false);
  } else {
    rope_kernel<T, INTERLEAVED, VEC, false><<<grid, block, 0, stream>>>(a, chunk_threads, heads_per_pass,
                                                                        table_vec);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_typed(const RopeArgs& a, cudaStream_t stream, LaunchInfo* info) {
  constexpr int L = 16 / static_cast<int>(sizeof(T));
  const int P = a.interleaved ? L / 2 : L;
  const int half = a.rotary_dim / 2;
  const int n_chunks = (half + P - 1) / P;
  const int tail = a.copy_tail ? a.head_dim - a.rotary_dim : 0;
  const int n_tail_chunks = (tail + L - 1) / L;
  const int n_heads = a.heads_q + a.heads_k;

  // 16-byte path: every pair group starts on a vector boundary (NeoX: R/2 % L == 0, GPT-J: R % L == 0) and all
  // four views allow vectors.
  bool vec = a.interleaved ? (a.rotary_dim % L == 0) : (half % L == 0);
  vec = vec && vector_friendly(a.q, a.batch, a.seqlen, a.heads_q, L) &&
        vector_friendly(a.out_q, a.batch, a.seqlen, a.heads_q, L);
  if (a.heads_k > 0) {
    vec = vec && vector_friendly(a.k, a.batch, a.seqlen, a.heads_k, L) &&
          vector_friendly(a.out_k, a.batch, a.seqlen, a.heads_k, L);
  }
  const int W = table_vector_width(P);
  const bool table_vec = vec && !a.cos_per_token &&
                         table_friendly(a.cos, a.cos_dtype, a.cos_stride, a.table_len, W) &&
                         table_friendly(a.sin, a.sin_dtype, a.sin_stride, a.table_len, W);

  // Threads of one token: chunk_threads per head (enough to cover the rotary pairs, or the tail if that is longer),
  // times heads_per_pass heads side by side; the heads beyond that are visited in a loop, reusing cos/sin.
  const int row_cap = clamp_threads(a.row_threads_cap, kMaxBlockThreads);
  const int block_target = clamp_threads(a.block_threads_target, 256);
  int chunk_threads = n_chunks > n_tail_chunks ? n_chunks : n_tail_chunks;
  if (chunk_threads > row_cap) chunk_threads = row_cap;
  if (chunk_threads < 1) chunk_threads = 1;
  const int64_t row_threads = static_cast<int64_t>(chunk_threads) * n_heads;
  const int64_t passes = (row_threads + row_cap - 1) / row_cap;
  int heads_per_pass = static_cast<int>((n_heads + passes - 1) / passes);
  if (heads_per_pass > row_cap / chunk_threads) heads_per_pass = row_cap / chunk_threads;  // rounding up overshot
  const int threads_x = chunk_threads * heads_per_pass;
  int64_t tokens_per_block = block_target / threads_x;
  if (tokens_per_block < 1) tokens_per_block = 1;
  if (tokens_per_block > a.seqlen) tokens_per_block = a.seqlen;
  const int64_t token_blocks = (a.seqlen + tokens_per_block - 1) / tokens_per_block;
  if (token_blocks > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
  const dim3 block(static_cast<unsigned>(threads_x), static_cast<unsigned>(tokens_per_block), 1);
  const dim3 grid(static_cast<unsigned>(token_blocks), static_cast<unsigned>(a.batch < 65535 ? a.batch : 65535), 1);

  if (info != nullptr) {
    info->grid[0] = grid.x; info->grid[1] = grid.y; info->grid[2] = grid.z;
    info->block[0] = block.x; info->block[1] = block.y; info->block[2] = block.z;
    info->vectorized = vec ? 1 : 0;
    info->table_vectorized = table_vec ? 1 : 0;
    info->pairs_per_thread = P;
    info->chunk_threads = chunk_threads;
    info->heads_per_pass = heads_per_pass;
  }
  if (a.interleaved) {
    return vec ? launch_variant<T, true, true>(a, grid, block, chunk_threads, heads_per_pass, table_vec, stream)
               : launch_variant<T, true, false>(a, grid, block, chunk_threads, heads_per_pass, table_vec, stream);
  }
  return vec ? launch_variant<T, false, true>(a, grid, block, chunk_threads, heads_per_pass, table_vec, stream)
             : launch_variant<T, false, false>(a, grid, block, chunk_threads, heads_per_pass, table_vec, stream);
}

}  // namespace

cudaError_t launch_rope(const RopeArgs& a, cudaStream_t stream, LaunchInfo* info) {
  if (a.batch <= 0 || a.seqlen <= 0 || a.heads_q + a.heads_k <= 0 || a.rotary_dim <= 0) return cudaSuccess;
  switch (a.dtype) {
    case kFloat32: return launch_typed<float>(a, stream, info);
    case kFloat16: return launch_typed<__half>(a, stream, info);
    case kBFloat16: return launch_typed<__nv_bfloat16>(a, stream, info);
    case kFloat64: return launch_typed<double>(a, stream, info);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t launch_cos_sin_table(float* cos, float* sin, int64_t max_positions, int rotary_dim, double base,
                                 bool fast, int block_size, cudaStream_t stream) {
  const int64_t total = max_positions * (rotary_dim / 2);
  if (total <= 0) return cudaSuccess;
  const int threads = block_size > 0 ? block_size : 256;
  int64_t blocks = (total + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536;  // grid-stride loop beyond that
  if (blocks < 1) blocks = 1;
  if (fast) {
    cos_sin_table_kernel<true><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(cos, sin, max_positions,
                                                                                       rotary_dim, base);
  } else {
    cos_sin_table_kernel<false><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(cos, sin, max_positions,
                                                                                        rotary_dim, base);
  }
  return cudaGetLastError();
}

}  // namespace ropekit
