// Given, not part of the exercise: what a CUDA kernel body needs to compile as host C++ (ropekit/course/cuda_cpu.py).
// The emulation runs one thread at a time, so it is exact for kernels whose threads do not talk to each other (no
// __shared__, __syncthreads or warp shuffles: those are left undefined, and the build says so). Every float pointer of
// the kernel is a Ptr: each access is checked against its tensor's elements, recorded with the thread that made it when
// it falls outside, and carried out only inside the allocation the checker made (poison and canaries around the view).
#include <cmath>
#include <cstdint>
#include <algorithm>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
static dim3 threadIdx, blockIdx, blockDim, gridDim;

using std::max;
using std::min;
inline float __sinf(float a) { return std::sin(a); }
inline float __cosf(float a) { return std::cos(a); }
inline float __expf(float a) { return std::exp(a); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline void __sincosf(float a, float* s, float* c) { *s = std::sin(a); *c = std::cos(a); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }

namespace ropekit_emu {

// One tensor as the kernel sees it; indices are elements from the view's first element.
struct Buffer {
    float* base;            // the view's first element
    int64_t view_end;       // elements [0, view_end) are the tensor's
    int64_t alloc_begin;    // elements [alloc_begin, alloc_end) exist (the checker's guard zones around the view)
    int64_t alloc_end;
    int64_t* writer;        // per element of the view: the global thread that last stored it (-1: none); may be null
};

// What went wrong, by whom: read back by cuda_cpu.py (all fields int64, in this order).
struct Report {
    int64_t bad_accesses, bad_threads;
    int64_t load_seen, load_buffer, load_index, load_block, load_thread;     // the first load outside its tensor
    int64_t store_seen, store_buffer, store_index, store_block, store_thread;  // the first store outside its tensor
    int64_t overlaps, overlap_buffer, overlap_index, overlap_first, overlap_second;  // two threads, one element
};

static Report* report = nullptr;
static Buffer* buffers = nullptr;
static int64_t block = 0, thread = 0, global_thread = 0, last_bad_thread = -1;
static float sink = 0.0f;  // where an access outside the allocation goes instead

inline void start(Report* r, Buffer* b) {
    report = r;
    buffers = b;
    *report = Report{};
    last_bad_thread = -1;
}

inline void thread_starts(int64_t b, int64_t t) {
    block = b;
    thread = t;
    global_thread = b * blockDim.x + t;
}

inline int64_t buffer_number(const Buffer* buffer) { return buffer - buffers; }

inline bool check(Buffer* buffer, int64_t index, bool store) {
    if (index >= 0 && index < buffer->view_end) {
        if (store && buffer->writer) {
            int64_t& who = buffer->writer[index];
            if (who >= 0 && who != global_thread) {
                if (report->overlaps++ == 0) {
                    report->overlap_buffer = buffer_number(buffer);
                    report->overlap_index = index;
                    report->overlap_first = who;
                    report->overlap_second = global_thread;
                }
            }
            who = global_thread;
        }
        return true;
    }
    report->bad_accesses++;
    if (last_bad_thread != global_thread) {
        report->bad_threads++;
        last_bad_thread = global_thread;
    }
    int64_t* first = store ? &report->store_seen : &report->load_seen;
    if (first[0] == 0) {
        first[0] = 1;
        first[1] = buffer_number(buffer);
        first[2] = index;
        first[3] = block;
        first[4] = thread;
    }
    return index >= buffer->alloc_begin && index < buffer->alloc_end;
}

template <class T>
struct Ref {  // out[i]: a load when read, a store when assigned
    Buffer* buffer;
    int64_t index;
    operator float() const { return check(buffer, index, false) ? buffer->base[index] : NAN; }
    Ref& operator=(float value) {
        (check(buffer, index, true) ? buffer->base[index] : sink) = value;
        return *this;
    }
    Ref& operator=(const Ref& other) { return *this = static_cast<float>(other); }
    Ref& operator+=(float value) { return *this = static_cast<float>(*this) + value; }
    Ref& operator-=(float value) { return *this = static_cast<float>(*this) - value; }
    Ref& operator*=(float value) { return *this = static_cast<float>(*this) * value; }
};

template <class T>
struct Ptr {
    Buffer* buffer;
    int64_t offset = 0;
    explicit Ptr(Buffer* b, int64_t o = 0) : buffer(b), offset(o) {}
    template <class U>
    Ptr(const Ptr<U>& other) : buffer(other.buffer), offset(other.offset) {}  // float* -> const float*
    Ref<T> operator[](int64_t i) const { return Ref<T>{buffer, offset + i}; }
    Ref<T> operator*() const { return Ref<T>{buffer, offset}; }
    Ptr operator+(int64_t i) const { return Ptr(buffer, offset + i); }
    Ptr operator-(int64_t i) const { return Ptr(buffer, offset - i); }
    Ptr& operator+=(int64_t i) { offset += i; return *this; }
    Ptr& operator-=(int64_t i) { offset -= i; return *this; }
    Ptr& operator++() { ++offset; return *this; }
};
template <class T>
Ptr<T> operator+(int64_t i, const Ptr<T>& p) { return p + i; }

// A const float's Ref may only be read: assigning to it does not compile, as on a GPU.
template <>
struct Ref<const float> {
    Buffer* buffer;
    int64_t index;
    operator float() const { return check(buffer, index, false) ? buffer->base[index] : NAN; }
};

}  // namespace ropekit_emu
