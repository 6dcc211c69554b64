// Deliberately wrong (used by tests/test_course.py only): the solution with one mistake, marked MISTAKE.
// One CUDA thread per pair. x and out: contiguous float32 (batch, seq, heads, head_dim); cos_table, sin_table:
// contiguous float32 (table_len, head_dim / 2), row p = position p. NeoX pairs (i, i + head_dim / 2).
// Thread `pair` (0 <= pair < n_pairs = batch * seq * heads * head_dim / 2) rotates pair i = pair % (head_dim / 2)
// of row pair / (head_dim / 2); that row's token sits at position (row / n_heads) % seq_len.
// The grid is rounded up to whole blocks: some threads have no pair.
__global__ void rope_pairs_kernel(const float* __restrict__ x, const float* __restrict__ cos_table,
                                  const float* __restrict__ sin_table, float* __restrict__ out,
                                  int n_pairs, int seq_len, int n_heads, int head_dim) {
    const int pair = blockIdx.x * blockDim.x + threadIdx.x;
    const int half = head_dim / 2;
    const int row = pair / half;
    const int i = pair % half;
    const int position = (row / n_heads) % seq_len;
    const float c = cos_table[position * half + i];
    const float s = sin_table[position * half + i];
    const float a = x[row * head_dim + i];  // MISTAKE: loaded before the bounds check, by every thread
    const float b = x[row * head_dim + half + i];
    if (pair >= n_pairs) return;
    out[row * head_dim + i] = a * c - b * s;
    out[row * head_dim + half + i] = b * c + a * s;
}
