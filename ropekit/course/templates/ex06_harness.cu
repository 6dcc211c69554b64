// Given, not part of the exercise: the host function the checker calls (through ctypes) to launch the reader's kernel.
#include <cuda_runtime.h>

extern "C" int ropekit_course_launch(const float* x, const float* cos_table, const float* sin_table, float* out,
                                     int batch, int seq_len, int n_heads, int head_dim) {
    const int n_pairs = batch * seq_len * n_heads * (head_dim / 2);
    const int threads = 128;
    const int blocks = (n_pairs + threads - 1) / threads;
    if (blocks > 0) {
        rope_pairs_kernel<<<blocks, threads>>>(x, cos_table, sin_table, out, n_pairs, seq_len, n_heads, head_dim);
    }
    return static_cast<int>(cudaGetLastError());
}
