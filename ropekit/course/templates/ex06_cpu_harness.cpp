// Given, not part of the exercise: the CPU emulation of exercise 06's launch (ropekit/course/cuda_cpu.py).
// The reader's kernel is compiled as host C++ after ex06_cpu_shim.h, which makes __global__ a plain function,
// blockIdx/threadIdx/blockDim/gridDim globals and every float pointer a checked one. This function runs the kernel
// once for every (block, thread) of the launch ex06_harness.cu makes on a GPU, one thread after another.

extern "C" int ropekit_course_emulate(ropekit_emu::Buffer* buffers, int batch, int seq_len, int n_heads,
                                      int head_dim, ropekit_emu::Report* report) {
    const int n_pairs = batch * seq_len * n_heads * (head_dim / 2);
    const int threads = 128;
    const int blocks = (n_pairs + threads - 1) / threads;
    ropekit_emu::start(report, buffers);
    blockDim = dim3{static_cast<unsigned>(threads), 1, 1};
    gridDim = dim3{static_cast<unsigned>(blocks), 1, 1};
    for (int b = 0; b < blocks; ++b) {
        for (int t = 0; t < threads; ++t) {
            blockIdx = dim3{static_cast<unsigned>(b), 0, 0};
            threadIdx = dim3{static_cast<unsigned>(t), 0, 0};
            ropekit_emu::thread_starts(b, t);
            rope_pairs_kernel(ropekit_emu::Ptr<const float>(&buffers[0]), ropekit_emu::Ptr<const float>(&buffers[1]),
                              ropekit_emu::Ptr<const float>(&buffers[2]), ropekit_emu::Ptr<float>(&buffers[3]),
                              n_pairs, seq_len, n_heads, head_dim);
        }
    }
    return blocks;
}
