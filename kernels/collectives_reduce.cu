// The kernels' entry points: collectives_<kind>_<op>_<dtype> and collectives_divide_<dtype>.
//
// kind is combine (dst = op(dst, src)), reduce_into (dst = op(a, b)) or reduce_many
// (dst = op(src0, ..., src{k-1}), 1 <= k <= kMaxInputs, in one pass); divide is avg's last
// step, buffer /= divisor, for the float dtypes. The (op, dtype) pairs are those of
// collectives/ops.py; collectives/backends/gpu_kernels.py derives the same names from it, and
// tests/test_gpu_kernels.py checks that the two lists agree.
#include "collectives_reduce.cuh"

#define COLLECTIVES_REDUCE_KERNELS(OP, OP_TYPE, DTYPE, D)                                             \
  extern "C" __global__ void __launch_bounds__(collectives::kBlockSize)                              \
      collectives_combine_##OP##_##DTYPE(collectives::D::Storage* dst,                                \
                                         const collectives::D::Storage* src, unsigned long long n) { \
    const collectives::Sources<collectives::D::Storage, 2> sources = {{dst, src}};                    \
    collectives::reduce_loop<collectives::D, collectives::OP_TYPE, 2>(dst, sources, 2, n,             \
                                                                     collectives::Keep());           \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(collectives::kBlockSize)                              \
      collectives_reduce_into_##OP##_##DTYPE(collectives::D::Storage* dst,                            \
                                             const collectives::D::Storage* a,                        \
                                             const collectives::D::Storage* b, unsigned long long n) { \
    const collectives::Sources<collectives::D::Storage, 2> sources = {{a, b}};                        \
    collectives::reduce_loop<collectives::D, collectives::OP_TYPE, 2>(dst, sources, 2, n,             \
                                                                     collectives::Keep());           \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(collectives::kBlockSize)                              \
      collectives_reduce_many_##OP##_##DTYPE(                                                         \
          collectives::D::Storage* dst, const collectives::D::Storage* s0,                            \
          const collectives::D::Storage* s1, const collectives::D::Storage* s2,                       \
          const collectives::D::Storage* s3, const collectives::D::Storage* s4,                       \
          const collectives::D::Storage* s5, const collectives::D::Storage* s6,                       \
          const collectives::D::Storage* s7, int k, unsigned long long n) {                           \
    const collectives::Sources<collectives::D::Storage, collectives::kMaxInputs> sources = {          \
        {s0, s1, s2, s3, s4, s5, s6, s7}};                                                            \
    collectives::reduce_loop<collectives::D, collectives::OP_TYPE, collectives::kMaxInputs>(         \
        dst, sources, k, n, collectives::Keep());                                                     \
  }

#define COLLECTIVES_DIVIDE_KERNEL(DTYPE, D)                                                           \
  extern "C" __global__ void __launch_bounds__(collectives::kBlockSize)                              \
      collectives_divide_##DTYPE(collectives::D::Storage* buffer, collectives::D::Acc divisor,         \
                                 unsigned long long n) {                                              \
    const collectives::Sources<collectives::D::Storage, 1> sources = {{buffer}};                      \
    const collectives::DivideBy<collectives::D::Acc> finish = {divisor};                              \
    collectives::reduce_loop<collectives::D, collectives::Sum, 1>(buffer, sources, 1, n, finish);    \
  }

// sum, prod, min, max and avg's divide: every dtype, the float ones here
#define COLLECTIVES_FLOAT_KERNELS(DTYPE, D)          \
  COLLECTIVES_REDUCE_KERNELS(sum, Sum, DTYPE, D)     \
  COLLECTIVES_REDUCE_KERNELS(prod, Prod, DTYPE, D)   \
  COLLECTIVES_REDUCE_KERNELS(min, Min, DTYPE, D)     \
  COLLECTIVES_REDUCE_KERNELS(max, Max, DTYPE, D)     \
  COLLECTIVES_DIVIDE_KERNEL(DTYPE, D)

// sum, prod, min, max and the bitwise ops: the integer dtypes (no avg, as in ops.py)
#define COLLECTIVES_INTEGER_KERNELS(DTYPE, D)        \
  COLLECTIVES_REDUCE_KERNELS(sum, Sum, DTYPE, D)     \
  COLLECTIVES_REDUCE_KERNELS(prod, Prod, DTYPE, D)   \
  COLLECTIVES_REDUCE_KERNELS(min, Min, DTYPE, D)     \
  COLLECTIVES_REDUCE_KERNELS(max, Max, DTYPE, D)     \
  COLLECTIVES_REDUCE_KERNELS(band, BitAnd, DTYPE, D) \
  COLLECTIVES_REDUCE_KERNELS(bor, BitOr, DTYPE, D)   \
  COLLECTIVES_REDUCE_KERNELS(bxor, BitXor, DTYPE, D)

COLLECTIVES_FLOAT_KERNELS(float16, Float16)
COLLECTIVES_FLOAT_KERNELS(bfloat16, BFloat16)
COLLECTIVES_FLOAT_KERNELS(float32, Float32)
COLLECTIVES_FLOAT_KERNELS(float64, Float64)

COLLECTIVES_INTEGER_KERNELS(int8, Int8)
COLLECTIVES_INTEGER_KERNELS(int16, Int16)
COLLECTIVES_INTEGER_KERNELS(int32, Int32)
COLLECTIVES_INTEGER_KERNELS(int64, Int64)
COLLECTIVES_INTEGER_KERNELS(uint8, UInt8)
COLLECTIVES_INTEGER_KERNELS(uint16, UInt16)
COLLECTIVES_INTEGER_KERNELS(uint32, UInt32)
COLLECTIVES_INTEGER_KERNELS(uint64, UInt64)
