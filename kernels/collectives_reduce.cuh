// Element-wise reductions over 1-D buffers: the dtypes, the ops, and one grid-stride loop.
//
// Header-free on purpose: NVRTC (and pip-installed CuPy) often has no cuda_fp16.h or
// cuda_bf16.h, so float16 and bfloat16 are stored as their 16-bit patterns and converted with
// inline PTX or exact bit arithmetic.
//
// Float arithmetic is written as PTX with an explicit rounding mode (add.rn, mul.rn, div.rn):
// CuPy compiles with -ftz=true, which would flush float32 and bfloat16 subnormals to zero where
// numpy keeps them, and an explicit rounding mode also keeps the compiler from fusing into FMAs.
// Results are then those of numpy (ml_dtypes for bfloat16): one IEEE operation per pair, computed
// in float32 for the 16-bit floats and rounded to nearest even.
//
// Each piece of PTX has a C++ twin for a host build (GCC or Clang, where __CUDA_ARCH__ is not
// defined) that computes the same IEEE operation: the tests compile these sources for the CPU and
// run every kernel thread by thread against numpy (tests/host_cuda.py), on machines with no GPU.
#pragma once

namespace collectives {

typedef signed char i8;
typedef short i16;
typedef int i32;
typedef long long i64;
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// reduce_many reads at most this many inputs in one pass; the loader chains passes beyond it
constexpr int kMaxInputs = 8;
// threads per block, as the loader launches them
constexpr int kBlockSize = 256;

// ---------------------------------------------------------------------------------------------
// dtypes: how an element is stored (Storage) and in which type it is reduced (Acc)

struct Float16 {
  typedef u16 Storage;
  typedef float Acc;
  static __device__ __forceinline__ float load(u16 bits) {
#if defined(__CUDA_ARCH__)
    float value;
    asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
    return value;
#else
    return (float)__builtin_bit_cast(_Float16, bits);
#endif
  }
  static __device__ __forceinline__ u16 store(float value) {
#if defined(__CUDA_ARCH__)
    u16 bits;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
    return bits;
#else
    return __builtin_bit_cast(u16, (_Float16)value);
#endif
  }
};

struct BFloat16 {
  typedef u16 Storage;
  typedef float Acc;
  static __device__ __forceinline__ float load(u16 bits) { return __uint_as_float((u32)bits << 16); }
  static __device__ __forceinline__ u16 store(float value) {
    u32 bits = __float_as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      return (u16)((bits >> 16) | 0x0040u);  // a NaN stays a (quiet) NaN, whatever its payload
    }
    bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
    return (u16)(bits >> 16);
  }
};

template <class T>
struct Native {
  typedef T Storage;
  typedef T Acc;
  static __device__ __forceinline__ T load(T value) { return value; }
  static __device__ __forceinline__ T store(T value) { return value; }
};

typedef Native<float> Float32;
typedef Native<double> Float64;
typedef Native<i8> Int8;
typedef Native<i16> Int16;
typedef Native<i32> Int32;
typedef Native<i64> Int64;
typedef Native<u8> UInt8;
typedef Native<u16> UInt16;
typedef Native<u32> UInt32;
typedef Native<u64> UInt64;

// ---------------------------------------------------------------------------------------------
// arithmetic: IEEE for floats, wrapping for integers

// One IEEE operation rounded to nearest even: on the GPU, PTX with the rounding mode written out;
// on the host, the same C++ operator.
#if defined(__CUDA_ARCH__)
#define COLLECTIVES_IEEE_OP(NAME, T, PTX, REG, OPERATOR)  \
  __device__ __forceinline__ T NAME(T a, T b) {           \
    T r;                                                  \
    asm(PTX " %0, %1, %2;" : "=" REG(r) : REG(a), REG(b)); \
    return r;                                             \
  }
#else
#define COLLECTIVES_IEEE_OP(NAME, T, PTX, REG, OPERATOR) \
  __device__ __forceinline__ T NAME(T a, T b) { return a OPERATOR b; }
#endif

COLLECTIVES_IEEE_OP(add, float, "add.rn.f32", "f", +)
COLLECTIVES_IEEE_OP(add, double, "add.rn.f64", "d", +)
COLLECTIVES_IEEE_OP(mul, float, "mul.rn.f32", "f", *)
COLLECTIVES_IEEE_OP(mul, double, "mul.rn.f64", "d", *)
COLLECTIVES_IEEE_OP(divide, float, "div.rn.f32", "f", /)
COLLECTIVES_IEEE_OP(divide, double, "div.rn.f64", "d", /)
#undef COLLECTIVES_IEEE_OP

// Integers wrap as numpy's do. Signed overflow is undefined in C++, and small types promote to
// (signed) int, so the arithmetic is done in an unsigned type at least 32 bits wide.
template <class T> struct Wide { typedef u32 type; };
template <> struct Wide<i64> { typedef u64 type; };
template <> struct Wide<u64> { typedef u64 type; };

template <class T>
__device__ __forceinline__ T add(T a, T b) {
  typedef typename Wide<T>::type W;
  return (T)((W)a + (W)b);
}
template <class T>
__device__ __forceinline__ T mul(T a, T b) {
  typedef typename Wide<T>::type W;
  return (T)((W)a * (W)b);
}

// min and max propagate NaN as np.minimum and np.maximum do. Floats are compared through an
// integer key, which orders them exactly (subnormals included, -0 below +0) whatever -ftz says.
__device__ __forceinline__ bool is_nan(float x) { return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u; }
__device__ __forceinline__ bool is_nan(double x) {
  return ((u64)__double_as_longlong(x) & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
}
__device__ __forceinline__ i32 order_key(float x) {
  i32 bits = __float_as_int(x);
  return bits < 0 ? bits ^ 0x7fffffff : bits;
}
__device__ __forceinline__ i64 order_key(double x) {
  i64 bits = __double_as_longlong(x);
  return bits < 0 ? bits ^ 0x7fffffffffffffffll : bits;
}

template <class T>
__device__ __forceinline__ T min_of(T a, T b) { return b < a ? b : a; }
template <class T>
__device__ __forceinline__ T max_of(T a, T b) { return a < b ? b : a; }

template <class F>
__device__ __forceinline__ F float_min(F a, F b) {
  if (is_nan(a)) return a;
  if (is_nan(b)) return b;
  return order_key(b) < order_key(a) ? b : a;
}
template <class F>
__device__ __forceinline__ F float_max(F a, F b) {
  if (is_nan(a)) return a;
  if (is_nan(b)) return b;
  return order_key(a) < order_key(b) ? b : a;
}
template <> __device__ __forceinline__ float min_of(float a, float b) { return float_min(a, b); }
template <> __device__ __forceinline__ double min_of(double a, double b) { return float_min(a, b); }
template <> __device__ __forceinline__ float max_of(float a, float b) { return float_max(a, b); }
template <> __device__ __forceinline__ double max_of(double a, double b) { return float_max(a, b); }

// ---------------------------------------------------------------------------------------------
// ops: the binary combination, applied to accumulators

struct Sum {
  template <class A> static __device__ __forceinline__ A apply(A a, A b) { return add(a, b); }
};
struct Prod {
  template <class A> static __device__ __forceinline__ A apply(A a, A b) { return mul(a, b); }
};
struct Min {
  template <class A> static __device__ __forceinline__ A apply(A a, A b) { return min_of(a, b); }
};
struct Max {
  template <class A> static __device__ __forceinline__ A apply(A a, A b) { return max_of(a, b); }
};
struct BitAnd {
  template <class A> static __device__ __forceinline__ A apply(A a, A b) { return (A)(a & b); }
};
struct BitOr {
  template <class A> static __device__ __forceinline__ A apply(A a, A b) { return (A)(a | b); }
};
struct BitXor {
  template <class A> static __device__ __forceinline__ A apply(A a, A b) { return (A)(a ^ b); }
};

// what happens to the reduced value before it is stored
struct Keep {
  template <class A> __device__ __forceinline__ A operator()(A value) const { return value; }
};
template <class A>
struct DivideBy {
  A divisor;
  __device__ __forceinline__ A operator()(A value) const { return divide(value, divisor); }
};

// ---------------------------------------------------------------------------------------------
// the loop: dst[i] = finish(op(src0[i], ..., src{k-1}[i])) for i < n

template <class S, int MaxK>
struct Sources {
  const S* p[MaxK];
};

// 16 bytes of elements, loaded and stored as one 128-bit access
template <class S>
union Pack {
  uint4 bits;
  S e[16 / sizeof(S)];
};

template <class D, class Op, int MaxK, class Finish>
__device__ __forceinline__ void reduce_one(typename D::Storage* dst, const Sources<typename D::Storage, MaxK>& src,
                                           int k, u64 i, const Finish& finish) {
  typename D::Acc acc = D::load(src.p[0][i]);
#pragma unroll
  for (int j = 1; j < MaxK; ++j) {
    if (j < k) acc = Op::apply(acc, D::load(src.p[j][i]));
  }
  dst[i] = D::store(finish(acc));
}

template <class D, class Op, int MaxK, class Finish>
__device__ __forceinline__ void reduce_pack(typename D::Storage* dst, const Sources<typename D::Storage, MaxK>& src,
                                            int k, u64 i, const Finish& finish) {
  typedef typename D::Storage S;
  constexpr int kWidth = 16 / sizeof(S);
  // every load is issued before any arithmetic, so the memory system sees them all at once
  Pack<S> in[MaxK];
#pragma unroll
  for (int j = 0; j < MaxK; ++j) {
    if (j < k) in[j].bits = *reinterpret_cast<const uint4*>(src.p[j] + i);
  }
  Pack<S> out;
#pragma unroll
  for (int e = 0; e < kWidth; ++e) {
    typename D::Acc acc = D::load(in[0].e[e]);
#pragma unroll
    for (int j = 1; j < MaxK; ++j) {
      if (j < k) acc = Op::apply(acc, D::load(in[j].e[e]));
    }
    out.e[e] = D::store(finish(acc));
  }
  *reinterpret_cast<uint4*>(dst + i) = out.bits;
}

// Grid-stride loop. Where dst and every source sit at the same offset from a 16-byte boundary,
// a scalar head reaches the boundary, 128-bit accesses do the body and a scalar tail the rest;
// otherwise every element takes the scalar path.
template <class D, class Op, int MaxK, class Finish>
__device__ __forceinline__ void reduce_loop(typename D::Storage* dst, const Sources<typename D::Storage, MaxK>& src,
                                            int k, u64 n, const Finish& finish) {
  typedef typename D::Storage S;
  constexpr u64 kWidth = 16 / sizeof(S);
  const u64 start = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  const u32 offset = (u32)((u64)dst & 15u);
  bool aligned = offset % sizeof(S) == 0;
#pragma unroll
  for (int j = 0; j < MaxK; ++j) {
    if (j < k) aligned = aligned && (u32)((u64)src.p[j] & 15u) == offset;
  }
  u64 head = n;
  u64 packs = 0;
  if (aligned) {
    head = ((16u - offset) & 15u) / sizeof(S);
    if (head > n) head = n;
    packs = (n - head) / kWidth;
  }
  for (u64 i = start; i < head; i += stride) reduce_one<D, Op, MaxK>(dst, src, k, i, finish);
  for (u64 p = start; p < packs; p += stride) reduce_pack<D, Op, MaxK>(dst, src, k, head + p * kWidth, finish);
  for (u64 i = head + packs * kWidth + start; i < n; i += stride) reduce_one<D, Op, MaxK>(dst, src, k, i, finish);
}

}  // namespace collectives
