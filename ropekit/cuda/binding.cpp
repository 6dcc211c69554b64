// The PyTorch side of ropekit's CUDA kernels: tensors in, checked, turned into rope.h's plain structs, launched on the
// current CUDA stream; every launch's error comes back as a Python RuntimeError.
//
// The kernels (rope.cu) include only CUDA headers; everything that needs torch is here. Nothing here synchronises
// with the device or reads values inside device tensors, so a call can be captured in a CUDA graph.

#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <climits>
#include <cmath>
#include <optional>
#include <vector>

#include "rope.h"

namespace {

int dtype_code(at::ScalarType type, const char* name) {
  switch (type) {
    case at::kFloat: return ropekit::kFloat32;
    case at::kHalf: return ropekit::kFloat16;
    case at::kBFloat16: return ropekit::kBFloat16;
    case at::kDouble: return ropekit::kFloat64;
    default: TORCH_CHECK(false, name, " must be float16, bfloat16, float32 or float64, got ", type);
  }
  return -1;
}

void check_on_device(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got one on ", t.device());
  TORCH_CHECK(t.device() == q.device(), name, " is on ", t.device(), " but q is on ", q.device());
}

void check_rope_tensor(const at::Tensor& t, const char* name, const at::Tensor& q) {
  check_on_device(t, name, q);
  TORCH_CHECK(t.dim() == 4, name, " must be a 4-D (batch, seq, heads, head_dim) view, got shape ", t.sizes());
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), name, " must have q's dtype ", q.scalar_type(), ", got ",
              t.scalar_type());
  TORCH_CHECK(t.size(0) == q.size(0) && t.size(1) == q.size(1) && t.size(3) == q.size(3), name,
              " must share q's (batch, seq, head_dim) = (", q.size(0), ", ", q.size(1), ", ", q.size(3), "), got ",
              t.sizes());
  TORCH_CHECK(t.size(2) <= INT_MAX, name, " has too many heads: ", t.size(2));
}

ropekit::TensorView view_of(const at::Tensor& t) {
  ropekit::TensorView v;
  v.data = t.data_ptr();
  for (int d = 0; d < 4; ++d) v.stride[d] = t.stride(d);
  return v;
}

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "ropekit CUDA: launching the ", what, " kernel failed: ", cudaGetErrorName(err), ": ",
              cudaGetErrorString(err));
}

// rope(q, k, cos, sin, out_q, out_k, pos_mode, position_offset, positions, rotary_dim, interleaved, conjugate,
//      cos_per_token, copy_tail, block_threads_target, row_threads_cap) -> launch description
// Returns [grid.x, grid.y, grid.z, block.x, block.y, block.z, vectorized, table_vectorized, pairs_per_thread,
// chunk_threads, heads_per_pass] (empty when there was nothing to launch).
std::vector<int64_t> rope(const at::Tensor& q, const std::optional<at::Tensor>& k, const at::Tensor& cos,
                          const at::Tensor& sin, const at::Tensor& out_q, const std::optional<at::Tensor>& out_k,
                          int64_t pos_mode, int64_t position_offset, const std::optional<at::Tensor>& positions,
                          int64_t rotary_dim, bool interleaved, bool conjugate, bool cos_per_token, bool copy_tail,
                          int64_t block_threads_target, int64_t row_threads_cap) {
  TORCH_CHECK(q.is_cuda(), "q must be a CUDA tensor, got one on ", q.device());
  TORCH_CHECK(q.dim() == 4, "q must be a 4-D (batch, seq, heads, head_dim) view, got shape ", q.sizes());
  const int dtype = dtype_code(q.scalar_type(), "q");
  TORCH_CHECK(q.size(2) <= INT_MAX && q.size(3) <= INT_MAX, "q is too large in heads or head_dim: ", q.sizes());
  check_rope_tensor(out_q, "out_q", q);
  TORCH_CHECK(out_q.size(2) == q.size(2), "out_q must have q's shape ", q.sizes(), ", got ", out_q.sizes());
  TORCH_CHECK(k.has_value() == out_k.has_value(), "k and out_k must both be given or both be None");
  if (k.has_value()) {
    check_rope_tensor(*k, "k", q);
    check_rope_tensor(*out_k, "out_k", q);
    TORCH_CHECK(out_k->size(2) == k->size(2), "out_k must have k's shape ", k->sizes(), ", got ", out_k->sizes());
  }
  const int64_t head_dim = q.size(3);
  TORCH_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim,
              "rotary_dim must be a positive even number <= head_dim (", head_dim, "), got ", rotary_dim);

  check_on_device(cos, "cos", q);
  check_on_device(sin, "sin", q);
  TORCH_CHECK(cos.sizes() == sin.sizes(), "cos and sin must have the same shape, got ", cos.sizes(), " and ",
              sin.sizes());
  ropekit::RopeArgs args;
  args.cos = cos.data_ptr();
  args.sin = sin.data_ptr();
  args.cos_dtype = dtype_code(cos.scalar_type(), "cos");
  args.sin_dtype = dtype_code(sin.scalar_type(), "sin");
  args.cos_per_token = cos_per_token;
  if (cos_per_token) {
    TORCH_CHECK(cos.dim() == 3 && cos.size(0) == q.size(0) && cos.size(1) == q.size(1) && cos.size(2) >= rotary_dim,
                "per-token cos/sin must be (batch, seq, >= rotary_dim) = (", q.size(0), ", ", q.size(1), ", ",
                rotary_dim, "), got ", cos.sizes());
    for (int d = 0; d < 3; ++d) {
      args.cos_stride[d] = cos.stride(d);
      args.sin_stride[d] = sin.stride(d);
    }
  } else {
    TORCH_CHECK(cos.dim() == 2 && 2 * cos.size(1) >= rotary_dim,
                "cos/sin tables must be (max_positions, >= rotary_dim/2) with rotary_dim/2 = ", rotary_dim / 2,
                ", got ", cos.sizes());
    args.cos_stride[1] = cos.stride(0);
    args.cos_stride[2] = cos.stride(1);
    args.sin_stride[1] = sin.stride(0);
    args.sin_stride[2] = sin.stride(1);
    args.table_len = cos.size(0);

    TORCH_CHECK(pos_mode >= ropekit::kScalarOffset && pos_mode <= ropekit::kPositionIds,
                "pos_mode must be 0 (scalar offset), 1 (per-sequence offsets) or 2 (position ids), got ", pos_mode);
    args.pos_mode = static_cast<int>(pos_mode);
    args.position_offset = position_offset;
    if (pos_mode != ropekit::kScalarOffset) {
      TORCH_CHECK(positions.has_value(), "pos_mode ", pos_mode, " needs a positions tensor");
      const at::Tensor& pos = *positions;
      check_on_device(pos, "positions", q);
      TORCH_CHECK(pos.scalar_type() == at::kInt || pos.scalar_type() == at::kLong,
                  "positions must be an int32 or int64 tensor, got ", pos.scalar_type());
      if (pos_mode == ropekit::kSeqOffsets) {
        TORCH_CHECK(pos.dim() == 1 && pos.size(0) == q.size(0), "per-sequence offsets must have shape (",
                    q.size(0), ",), got ", pos.sizes());
        args.pos_stride[0] = pos.stride(0);
      } else {
        TORCH_CHECK(pos.dim() == 2 && pos.size(0) == q.size(0) && pos.size(1) == q.size(1),
                    "position ids must be a (batch, seq) = (", q.size(0), ", ", q.size(1), ") view, got ",
                    pos.sizes());
        args.pos_stride[0] = pos.stride(0);
        args.pos_stride[1] = pos.stride(1);
      }
      args.positions = pos.data_ptr();
      args.positions_int64 = pos.scalar_type() == at::kLong;
    }
  }

  if (q.numel() == 0 || q.size(0) == 0 || q.size(1) == 0) return {};
  args.q = view_of(q);
  args.out_q = view_of(out_q);
  if (k.has_value()) {
    args.k = view_of(*k);
    args.out_k = view_of(*out_k);
    args.heads_k = static_cast<int>(k->size(2));
  } else {
    args.k = args.q;  // never read: heads_k == 0
    args.out_k = args.out_q;
  }
  args.dtype = dtype;
  args.batch = q.size(0);
  args.seqlen = q.size(1);
  args.heads_q = static_cast<int>(q.size(2));
  args.head_dim = static_cast<int>(head_dim);
  args.rotary_dim = static_cast<int>(rotary_dim);
  args.interleaved = interleaved;
  args.conjugate = conjugate;
  args.copy_tail = copy_tail && rotary_dim < head_dim;
  args.block_threads_target = static_cast<int>(block_threads_target);
  args.row_threads_cap = static_cast<int>(row_threads_cap);

  const c10::cuda::CUDAGuard device_guard(q.device());
  ropekit::LaunchInfo info;
  check_launch(ropekit::launch_rope(args, c10::cuda::getCurrentCUDAStream(), &info), "rope");
  return {info.grid[0],     info.grid[1],           info.grid[2],
          info.block[0],    info.block[1],          info.block[2],
          info.vectorized,  info.table_vectorized,  info.pairs_per_thread,
          info.chunk_threads, info.heads_per_pass};
}

// cos_sin_table(max_positions, rotary_dim, base, fast, device_index, block_size) -> (cos, sin), float32
// (max_positions, rotary_dim/2) tables filled on the device (see rope.h).
std::tuple<at::Tensor, at::Tensor> cos_sin_table(int64_t max_positions, int64_t rotary_dim, double base, bool fast,
                                                 int64_t device_index, int64_t block_size) {
  TORCH_CHECK(max_positions >= 0, "max_positions must be >= 0, got ", max_positions);
  TORCH_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= INT_MAX,
              "rotary_dim must be a positive even integer, got ", rotary_dim);
  TORCH_CHECK(base > 1.0 && std::isfinite(base), "base must be a finite number > 1, got ", base);
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index));
  const c10::cuda::CUDAGuard device_guard(device);
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  at::Tensor cos = at::empty({max_positions, rotary_dim / 2}, options);
  at::Tensor sin = at::empty({max_positions, rotary_dim / 2}, options);
  check_launch(ropekit::launch_cos_sin_table(cos.data_ptr<float>(), sin.data_ptr<float>(), max_positions,
                                             static_cast<int>(rotary_dim), base, fast, static_cast<int>(block_size),
                                             c10::cuda::getCurrentCUDAStream()),
               "cos/sin table");
  return {cos, sin};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ropekit's CUDA C++ RoPE kernels (see ropekit/cuda/rope.cu)";
  m.def("rope", &rope, "Rotate q and k in one launch (the contract of ropekit.triton.launch.rope_v4)", py::arg("q"),
        py::arg("k"), py::arg("cos"), py::arg("sin"), py::arg("out_q"), py::arg("out_k"), py::arg("pos_mode"),
        py::arg("position_offset"), py::arg("positions"), py::arg("rotary_dim"), py::arg("interleaved"),
        py::arg("conjugate"), py::arg("cos_per_token"), py::arg("copy_tail"), py::arg("block_threads_target"),
        py::arg("row_threads_cap"));
  m.def("cos_sin_table", &cos_sin_table, "Fill float32 cos/sin tables on the device", py::arg("max_positions"),
        py::arg("rotary_dim"), py::arg("base"), py::arg("fast"), py::arg("device_index"), py::arg("block_size"));
}
