// Thin wrappers over oneDNN primitives that are created once (untimed) and executed many times.
//
// Each wrapper owns its primitive and one execution slot per thread: pre-created memory objects
// whose data handles are swapped per call, and a user-provided scratchpad region, so executing
// never allocates a buffer (oneDNN still makes a few hundred bytes of internal bookkeeping
// allocations per execute, which no API avoids). Slots let the kernels call the same primitive
// from inside their own OpenMP loops, one slot per thread.
#pragma once
#include <array>
#include <map>
#include <cstddef>
#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <vector>

namespace ab {

dnnl::engine& cpu_engine();
// One stream per execution slot; created (untimed) by bind().
dnnl::stream& cpu_stream(int slot);
void ensure_streams(int slots);
std::string onednn_version();

// A 2-D or batched 4-D matrix product C = alpha * A * B (+ C when accumulating).
// Strides are in elements, in the order (batch0, batch1, rows, cols); any layout that
// strides express (transposes included) is accepted.
struct MatmulSpec {
  int64_t b0 = 1, b1 = 1;  // batch dimensions, e.g. (B, H)
  int64_t M = 0, N = 0, K = 0;
  std::array<int64_t, 4> a{}, b{}, c{};  // strides of A (M x K), B (K x N), C (M x N)
  float alpha = 1.0f;
  bool accumulate = false;
  // C += a float bias row (N) inside the product (2-D products only): run() takes it.
  bool bias = false;
  // The primitive runs inside the caller's own OpenMP loop (one thread per call): its
  // scratchpad is sized for one thread.
  bool single_thread = true;
  // Element types of A, B and C: f32 unless set, e.g. u8 x s8 -> s32 for an exact integer
  // product (BM_HashProduct in bench/micro.cpp).
  dnnl::memory::data_type ta = dnnl::memory::data_type::f32, tb = ta, tc = ta;

  // Row-major 2-D helper: A is M x K with row stride lda (or K x M when trans_a), B is K x N
  // with row stride ldb (or N x K when trans_b), C is M x N with row stride ldc.
  static MatmulSpec tile(int64_t M, int64_t N, int64_t K, int64_t lda, bool trans_a, int64_t ldb,
                         bool trans_b, int64_t ldc, float alpha = 1.0f, bool accumulate = false);
  // The same product with A and B in bf16 and C in float (the float accumulation of a bf16 path).
  MatmulSpec with_bf16_inputs() const {
    MatmulSpec s = *this;
    s.ta = s.tb = dnnl::memory::data_type::bf16;
    s.tc = dnnl::memory::data_type::f32;
    return s;
  }
};

class Matmul {
 public:
  Matmul() = default;
  explicit Matmul(const MatmulSpec& spec);
  size_t scratchpad_bytes() const { return scratch_bytes_; }
  // Creates `slots` execution slots; slot t uses the scratchpad at scratch + t * stride
  // (stride 0: scratchpad_bytes()).
  void bind(int slots, std::byte* scratch, size_t stride = 0);
  // A, B, C hold the spec's element types (float unless the spec says otherwise); bias: N
  // floats, given exactly when the spec has one.
  void run(int slot, const void* A, const void* B, void* C, const float* bias = nullptr) const;
  std::string impl() const;
  const MatmulSpec& spec() const { return spec_; }

 private:
  struct Slot {
    dnnl::memory a, b, c, s, bias;
    std::array<dnnl_exec_arg_t, 5> args{};
    int n_args = 4;
  };
  MatmulSpec spec_;
  dnnl::matmul::primitive_desc pd_;
  dnnl::matmul prim_;
  size_t scratch_bytes_ = 0;
  std::vector<Slot> slots_;
};

// Matmul primitives keyed by their spec: created while planning (untimed), looked up by spec in
// the timed code, so a kernel with many tile shapes (tails, chunks) names each product where it
// runs. All share one scratchpad region per execution slot.
class MatmulCache {
 public:
  // Creates the primitive if this spec is new.
  void add(const MatmulSpec& spec);
  bool has(const MatmulSpec& spec) const { return mms_.count(key_of(spec)) != 0; }
  // Throws std::logic_error for a spec that was never added: a planning bug, not bad input.
  const Matmul& get(const MatmulSpec& spec) const;
  void run(int slot, const MatmulSpec& spec, const void* A, const void* B, void* C) const {
    get(spec).run(slot, A, B, C);
  }
  // Largest scratchpad of any primitive, rounded to a cache line: the per-slot stride.
  size_t scratch_per_slot() const;
  void bind(int slots, std::byte* scratch);
  void clear() { mms_.clear(); }

 private:
  using Key = std::array<int64_t, 24>;
  static Key key_of(const MatmulSpec& s);
  std::map<Key, Matmul> mms_;
};

// Softmax along the last axis of a (rows, cols) row-major matrix, forward and backward,
// multi-threaded (called outside any parallel region). In place. The forward is oneDNN's
// primitive; the backward is one vectorised pass per row of our own, because oneDNN's softmax
// backward is its reference implementation on a CPU without AVX-512 (ONEDNN_VERBOSE: "ref:any",
// 116 ms of vanilla's 187 ms forward-backward at B 4, H 2, N 1024, D 32 on the AVX2 machine):
// a framework's softmax backward is a vectorised kernel of its own too.
class RowSoftmax {
 public:
  RowSoftmax() = default;
  RowSoftmax(int64_t rows, int64_t cols);
  size_t scratchpad_bytes() const { return scratch_bytes_; }
  void bind(std::byte* scratch);
  // x <- softmax(x) row-wise.
  void forward(float* x) const;
  // Given y = softmax(x) and dy, writes dx = y * (dy - rowsum(y * dy)) over dy.
  void backward(const float* y, float* dy) const;

 private:
  dnnl::softmax_forward::primitive_desc fwd_pd_;
  dnnl::softmax_forward fwd_;
  dnnl::memory::desc md_;
  int64_t rows_ = 0, cols_ = 0;
  size_t scratch_bytes_ = 0;
  std::byte* scratch_ = nullptr;
};

// GFLOP/s of a 1024^3 oneDNN matmul on `threads` OpenMP threads, best of five runs after a
// warm-up: the reference rate that reported GFLOP/s are read against.
double measure_gemm_gflops(int threads = 1);

}  // namespace ab
