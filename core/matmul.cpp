#include "core/matmul.hpp"

#include <omp.h>

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "core/memory.hpp"
#include "core/vecmath.hpp"

namespace ab {
namespace {
using dnnl::memory;
using tag_dims = memory::dims;

std::mutex g_stream_mutex;
std::vector<dnnl::stream>& streams() {
  static std::vector<dnnl::stream> s;
  return s;
}

// Sets OpenMP's thread count for the lifetime of the guard (primitive descriptors size their
// scratchpads for the thread count in force when they are created).
struct OmpThreadsGuard {
  int saved;
  explicit OmpThreadsGuard(int n) : saved(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~OmpThreadsGuard() { omp_set_num_threads(saved); }
};

memory::desc strided_desc(int64_t b0, int64_t b1, int64_t rows, int64_t cols,
                          const std::array<int64_t, 4>& st, memory::data_type type) {
  if (b0 == 1 && b1 == 1) {
    return memory::desc(tag_dims{rows, cols}, type, tag_dims{st[2], st[3]});
  }
  return memory::desc(tag_dims{b0, b1, rows, cols}, type, tag_dims{st[0], st[1], st[2], st[3]});
}

void set_handle(const memory& m, const void* p) {
  dnnl_memory_set_data_handle_v2(m.get(), const_cast<void*>(p), nullptr);
}
}  // namespace

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

void ensure_streams(int slots) {
  std::lock_guard<std::mutex> lock(g_stream_mutex);
  auto& s = streams();
  while (static_cast<int>(s.size()) < slots) s.emplace_back(cpu_engine());
}

dnnl::stream& cpu_stream(int slot) { return streams()[static_cast<size_t>(slot)]; }

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " (" + v->hash + ")";
}

MatmulSpec MatmulSpec::tile(int64_t M, int64_t N, int64_t K, int64_t lda, bool trans_a,
                            int64_t ldb, bool trans_b, int64_t ldc, float alpha,
                            bool accumulate) {
  MatmulSpec s;
  s.M = M;
  s.N = N;
  s.K = K;
  s.a = trans_a ? std::array<int64_t, 4>{0, 0, 1, lda} : std::array<int64_t, 4>{0, 0, lda, 1};
  s.b = trans_b ? std::array<int64_t, 4>{0, 0, 1, ldb} : std::array<int64_t, 4>{0, 0, ldb, 1};
  s.c = {0, 0, ldc, 1};
  s.alpha = alpha;
  s.accumulate = accumulate;
  return s;
}

Matmul::Matmul(const MatmulSpec& spec) : spec_(spec) {
  if (spec.M <= 0 || spec.N <= 0 || spec.K <= 0) throw std::invalid_argument("matmul: empty shape");
  auto ad = strided_desc(spec.b0, spec.b1, spec.M, spec.K, spec.a, spec.ta);
  auto bd = strided_desc(spec.b0, spec.b1, spec.K, spec.N, spec.b, spec.tb);
  auto cd = strided_desc(spec.b0, spec.b1, spec.M, spec.N, spec.c, spec.tc);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (spec.alpha != 1.0f) attr.set_output_scales(0, {spec.alpha});
  if (spec.accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  OmpThreadsGuard guard(spec.single_thread ? 1 : omp_get_max_threads());
  // (With a scale, oneDNN's order of scaling and adding the bias would be one more thing to know.)
  if (spec.bias && (spec.b0 != 1 || spec.b1 != 1 || spec.alpha != 1.0f))
    throw std::invalid_argument("matmul: a bias needs a 2-D product without a scale");
  const auto desc = spec.bias ? dnnl::matmul::desc(ad, bd, memory::desc(tag_dims{1, spec.N}, memory::data_type::f32, tag_dims{spec.N, 1}), cd)
                              : dnnl::matmul::desc(ad, bd, cd);
  pd_ = dnnl::matmul::primitive_desc(desc, attr, cpu_engine());
  prim_ = dnnl::matmul(pd_);
  scratch_bytes_ = pd_.scratchpad_desc().get_size();
}

void Matmul::bind(int slots, std::byte* scratch, size_t stride) {
  if (stride == 0) stride = scratch_bytes_;
  ensure_streams(slots);
  slots_.clear();
  slots_.resize(static_cast<size_t>(slots));
  for (int t = 0; t < slots; ++t) {
    Slot& s = slots_[static_cast<size_t>(t)];
    auto& e = cpu_engine();
    s.a = memory(pd_.src_desc(), e, DNNL_MEMORY_NONE);
    s.b = memory(pd_.weights_desc(), e, DNNL_MEMORY_NONE);
    s.c = memory(pd_.dst_desc(), e, DNNL_MEMORY_NONE);
    s.s = memory(pd_.scratchpad_desc(), e,
                 scratch_bytes_ ? static_cast<void*>(scratch + static_cast<size_t>(t) * stride) : nullptr);
    s.args = {dnnl_exec_arg_t{DNNL_ARG_SRC, s.a.get()}, dnnl_exec_arg_t{DNNL_ARG_WEIGHTS, s.b.get()},
              dnnl_exec_arg_t{DNNL_ARG_DST, s.c.get()},
              dnnl_exec_arg_t{DNNL_ARG_SCRATCHPAD, s.s.get()}, dnnl_exec_arg_t{}};
    if (spec_.bias) {
      s.bias = memory(pd_.bias_desc(), e, DNNL_MEMORY_NONE);
      s.args[4] = dnnl_exec_arg_t{DNNL_ARG_BIAS, s.bias.get()};
      s.n_args = 5;
    }
  }
}

void Matmul::run(int slot, const void* A, const void* B, void* C, const float* bias) const {
  const Slot& s = slots_[static_cast<size_t>(slot)];
  if (spec_.bias != (bias != nullptr)) throw std::logic_error("matmul: a bias exactly when the spec has one");
  set_handle(s.a, A);
  set_handle(s.b, B);
  set_handle(s.c, C);
  if (bias) set_handle(s.bias, bias);
  dnnl_status_t st = dnnl_primitive_execute(prim_.get(), cpu_stream(slot).get(), s.n_args, s.args.data());
  if (st != dnnl_success) throw std::runtime_error("oneDNN matmul execution failed");
}

std::string Matmul::impl() const { return pd_.impl_info_str(); }

MatmulCache::Key MatmulCache::key_of(const MatmulSpec& s) {
  int32_t alpha_bits;
  std::memcpy(&alpha_bits, &s.alpha, sizeof(alpha_bits));
  return Key{s.b0,   s.b1,   s.M,    s.N,    s.K,    s.a[0], s.a[1], s.a[2], s.a[3], s.b[0],
             s.b[1], s.b[2], s.b[3], s.c[0], s.c[1], s.c[2], s.c[3], alpha_bits, s.accumulate,
             s.single_thread, s.bias, static_cast<int64_t>(s.ta), static_cast<int64_t>(s.tb), static_cast<int64_t>(s.tc)};
}

void MatmulCache::add(const MatmulSpec& spec) {
  const Key k = key_of(spec);
  if (mms_.find(k) == mms_.end()) mms_.emplace(k, Matmul(spec));
}

const Matmul& MatmulCache::get(const MatmulSpec& spec) const {
  auto it = mms_.find(key_of(spec));
  if (it == mms_.end())
    throw std::logic_error(fmt::format("matmul {}x{}x{} was not planned", spec.M, spec.N, spec.K));
  return it->second;
}

size_t MatmulCache::scratch_per_slot() const {
  size_t m = 0;
  for (const auto& [k, mm] : mms_) m = std::max(m, mm.scratchpad_bytes());
  return (m + 63) / 64 * 64;
}

void MatmulCache::bind(int slots, std::byte* scratch) {
  const size_t stride = scratch_per_slot();
  for (auto& [k, mm] : mms_) mm.bind(slots, scratch, stride);
}

RowSoftmax::RowSoftmax(int64_t rows, int64_t cols) : rows_(rows), cols_(cols) {
  md_ = memory::desc(tag_dims{rows, cols}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  fwd_pd_ = dnnl::softmax_forward::primitive_desc(
      dnnl::softmax_forward::desc(dnnl::prop_kind::forward_inference, md_, 1), attr, cpu_engine());
  fwd_ = dnnl::softmax_forward(fwd_pd_);
  scratch_bytes_ = fwd_pd_.scratchpad_desc().get_size();
}

void RowSoftmax::bind(std::byte* scratch) {
  ensure_streams(1);
  scratch_ = scratch;
}

void RowSoftmax::forward(float* x) const {
  auto& e = cpu_engine();
  memory m(md_, e, x);
  memory s(fwd_pd_.scratchpad_desc(), e, scratch_);
  fwd_.execute(cpu_stream(0), {{DNNL_ARG_SRC, m}, {DNNL_ARG_DST, m}, {DNNL_ARG_SCRATCHPAD, s}});
}

// Row r: s = sum_j y_j dy_j, then dx_j = y_j (dy_j - s). Each row's two passes find it in
// cache; rows are independent, so the result does not depend on the number of threads.
void RowSoftmax::backward(const float* y, float* dy) const {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows_; ++r) {
    const float* yr = y + r * cols_;
    float* d = dy + r * cols_;
    const float s = dot(yr, d, cols_);
#pragma omp simd
    for (int64_t j = 0; j < cols_; ++j) d[j] = yr[j] * (d[j] - s);
  }
}

double measure_gemm_gflops(int threads) {
  constexpr int64_t n = 1024;
  Buffer<float> a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    a[static_cast<size_t>(i)] = 0.001f * static_cast<float>(i % 97);
    b[static_cast<size_t>(i)] = 0.002f * static_cast<float>(i % 89);
  }
  OmpThreadsGuard guard(threads);  // before the primitive is made: oneDNN plans for the threads it sees
  MatmulSpec spec = MatmulSpec::tile(n, n, n, n, false, n, false, n);
  spec.single_thread = threads == 1;
  Matmul mm(spec);
  Buffer<std::byte> scratch(mm.scratchpad_bytes());
  mm.bind(1, scratch.data());
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    mm.run(0, a.data(), b.data(), c.data());
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0 && dt < best) best = dt;  // the first run warms caches and the JIT
  }
  return 2.0 * n * n * n / best / 1e9;
}

}  // namespace ab
