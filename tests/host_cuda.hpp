// What the CUDA kernels in kernels/ need from CUDA, for a host build that runs them on the CPU.
//
// tests/host_cuda.py compiles the loader's translation unit (gpu_kernels.module_source()) as C++
// with this file included first. A launch runs every thread of the grid, one after another, in
// reverse order (CUDA promises no order; a kernel whose threads depended on one would show it).
// Each 128-bit access is checked for the 16-byte alignment a GPU faults without.
#pragma once

#include <cstdint>
#include <cstring>

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(threads)

struct dim3 {
  unsigned int x, y, z;
};

// the built-in indices: one translation unit, and one launch at a time
static dim3 blockIdx = {0, 0, 0};
static dim3 threadIdx = {0, 0, 0};
static dim3 blockDim = {1, 1, 1};
static dim3 gridDim = {1, 1, 1};

// 128-bit accesses that would fault on a GPU: counted, and the copy done anyway
static unsigned long long misaligned_accesses = 0;

// The kernels move 16 bytes as one uint4 (ld.global.v4 / st.global.v4 on a GPU): `*(uint4*)p = v`
// and `v = *(const uint4*)p` both go through this assignment, which sees both addresses. Unlike
// CUDA's, this uint4 is only 4-byte aligned, so the compiler cannot assume the check away.
struct uint4 {
  unsigned int x, y, z, w;
  uint4& operator=(const uint4& other) {
    if ((reinterpret_cast<std::uintptr_t>(this) | reinterpret_cast<std::uintptr_t>(&other)) & 15u) {
      ++misaligned_accesses;
    }
    std::memmove(this, &other, sizeof(uint4));
    return *this;
  }
};

template <class To, class From>
inline To bits_as(From value) {
  static_assert(sizeof(To) == sizeof(From), "same width");
  To result;
  std::memcpy(&result, &value, sizeof(To));
  return result;
}

inline float __uint_as_float(unsigned int bits) { return bits_as<float>(bits); }
inline unsigned int __float_as_uint(float value) { return bits_as<unsigned int>(value); }
inline int __float_as_int(float value) { return bits_as<int>(value); }
inline long long __double_as_longlong(double value) { return bits_as<long long>(value); }

// The kernels' parameter lists, by the kind of entry point. Pointers are passed as void*: the
// same registers as the kernels' typed pointers on every ABI this build targets.
typedef unsigned long long u64_t;
typedef void (*CombineKernel)(void*, const void*, u64_t);
typedef void (*ReduceIntoKernel)(void*, const void*, const void*, u64_t);
typedef void (*ReduceManyKernel)(void*, const void*, const void*, const void*, const void*, const void*,
                                 const void*, const void*, const void*, int, u64_t);
typedef void (*DivideFloatKernel)(void*, float, u64_t);
typedef void (*DivideDoubleKernel)(void*, double, u64_t);

enum HostForm { kCombine = 0, kReduceInto = 1, kReduceMany = 2, kDivideFloat = 3, kDivideDouble = 4 };

// Runs `kernel` on a grid of `blocks` x `threads`: pointers[0] is the output (the buffer, for
// divide), pointers[1..8] the inputs. Returns how many 128-bit accesses were misaligned.
extern "C" u64_t collectives_host_launch(void* kernel, int form, unsigned int blocks, unsigned int threads,
                                         void* const* pointers, int k, u64_t n, double divisor) {
  misaligned_accesses = 0;
  gridDim = {blocks, 1, 1};
  blockDim = {threads, 1, 1};
  for (unsigned int block = blocks; block-- > 0;) {
    for (unsigned int thread = threads; thread-- > 0;) {
      blockIdx = {block, 0, 0};
      threadIdx = {thread, 0, 0};
      void* const* p = pointers;
      switch (form) {
        case kCombine:
          reinterpret_cast<CombineKernel>(kernel)(p[0], p[1], n);
          break;
        case kReduceInto:
          reinterpret_cast<ReduceIntoKernel>(kernel)(p[0], p[1], p[2], n);
          break;
        case kReduceMany:
          reinterpret_cast<ReduceManyKernel>(kernel)(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], k, n);
          break;
        case kDivideFloat:
          reinterpret_cast<DivideFloatKernel>(kernel)(p[0], static_cast<float>(divisor), n);
          break;
        case kDivideDouble:
          reinterpret_cast<DivideDoubleKernel>(kernel)(p[0], divisor, n);
          break;
      }
    }
  }
  return misaligned_accesses;
}
