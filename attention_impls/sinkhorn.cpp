// sinkhorn: Sparse Sinkhorn attention.
// Paper: Tay et al. 2020, "Sparse Sinkhorn Attention".
// Complexity: with nb = N / block blocks, O(N·block·D) for the attention (each query attends
//   2·block keys), O(nb·N·D) = O(N²·D / block) for the block sort (K~ = P·K is a product of
//   nb x nb by nb x (block·D)), O(nb·D² + nb²·D) for the sorting network, O(iters·nb²) for
//   the Sinkhorn normalisation. Memory O(N·D) (the sorted keys and values) + O(nb²).
// Computes (mechanisms.md): block summaries x_b = mean of block b's query rows; logits
//   R = relu(x W1) W2 (nb x nb), W1 (D, D), W2 (D, nb) per head, seeded Glorot-uniform;
//   `sinkhorn_iters` rounds of row then column normalisation of R / temperature in log space
//   give P = exp(L), doubly stochastic; K~_b = Σ_c P_bc K_c and V~_b likewise (block-wise);
//   query block b attends the 2·block keys [K_b ; K~_b] with values [V_b ; V~_b]. Not causal.
// Optimises: the block sort is one matrix product per head over the keys viewed as an
//   nb x (block·D) matrix; the attention is two block x block products per block for the
//   logits and two for the output, all through oneDNN, on (batch, head) pairs in parallel.
// Backward: through everything: the attention, the sort (dK += Pᵀ dK~, dP = dK~ Kᵀ + dV~ Vᵀ),
//   the Sinkhorn iterations (recomputed in log space, each normalisation's Jacobian applied in
//   reverse), the sorting network and the block means, into dQ.
//   For training (param_grads) also the sorting network's dW1, dW2.
// Leaves out: the paper's causal variant (SortCut and causal Sinkhorn balancing): refused as
//   SKIPPED; attention dropout. FLOPs count the matrix products; the normalisation's exp and
//   sums are not counted.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "attention_impls/per_head_attention.hpp"
#include "attention_impls/registry.hpp"
#include "core/matmul.hpp"
#include "core/vecmath.hpp"

namespace ab {
namespace {

class Sinkhorn final : public PerHeadAttention {
 public:
  Sinkhorn(const AttnProblem& p, const ParamValues& v)
      : PerHeadAttention(p),
        block_(v.get_int("block")),
        iters_(v.get_int("sinkhorn_iters")),
        temperature_(v.get_float("temperature")),
        n_blocks_(p.shape.N / std::max<int64_t>(1, v.get_int("block"))) {}

  void validate() const override {
    if (problem_.shape.N % block_ != 0)
      throw InvalidInput("sinkhorn: N=" + std::to_string(problem_.shape.N) + " is not a multiple of block=" +
                         std::to_string(block_));
  }

  double flops(Mode mode) const override {
    const auto& s = problem_.shape;
    const double N = static_cast<double>(s.N), D = static_cast<double>(s.D), nb = static_cast<double>(n_blocks_),
                 b = static_cast<double>(block_);
    const double attention = 4.0 * D * N * 2.0 * b;        // QK and PV over N x 2·block pairs
    const double sort = 2.0 * (2.0 * nb * nb * b * D);      // K~ and V~
    const double network = 2.0 * nb * D * D + 2.0 * nb * D * nb;
    // Backward: attention 3.5x in all (recomputed logits, dA, dQ, dK, dV); the sort's dK, dV
    // and dP (two products) double it twice over; the network's two transposed products.
    // The weights' gradients (param_grads): two more products of the network's size.
    const double weights = problem_.param_grads ? network : 0.0;
    const double per_head =
        mode == Mode::fwd ? attention + sort + network : 3.5 * attention + 3.0 * sort + 2.0 * network + weights;
    return per_head * static_cast<double>(s.B * s.H);
  }

  size_t working_bytes(Mode mode) const override {
    plan(mode);
    return (persistent_floats(mode) + static_cast<size_t>(problem_.threads) * thread_floats(mode)) * sizeof(float) + scratchpad_bytes();
  }

  void setup(Mode mode, Rng& rng) override {
    plan(mode);  // the layout below depends on the products' scratchpads
    const auto& s = problem_.shape;
    const int64_t D = s.D, H = s.H, BH = s.B * s.H;
    W1_ = Buffer<float>(static_cast<size_t>(H * D * D));
    W2_ = Buffer<float>(static_cast<size_t>(H * D * n_blocks_));
    const double l1 = std::sqrt(6.0 / (2.0 * D)), l2 = std::sqrt(6.0 / static_cast<double>(D + n_blocks_));
    rng.fill_uniform(W1_.data(), static_cast<int64_t>(W1_.size()), -l1, l1);
    rng.fill_uniform(W2_.data(), static_cast<int64_t>(W2_.size()), -l2, l2);
    P_ = Buffer<float>(static_cast<size_t>(BH * n_blocks_ * n_blocks_));
    R_ = Buffer<float>(static_cast<size_t>(BH * n_blocks_ * n_blocks_));
    pre_ = Buffer<float>(static_cast<size_t>(BH * n_blocks_ * D));
    Ks_ = Buffer<float>(static_cast<size_t>(BH * s.N * D));
    Vs_ = Buffer<float>(static_cast<size_t>(BH * s.N * D));
    lse_ = Buffer<float>(static_cast<size_t>(BH * s.N));
    work_ = Buffer<float>(static_cast<size_t>(problem_.threads) * thread_floats(mode));
    if (problem_.param_grads && mode == Mode::fwdbwd) {
      grads_ = Buffer<float>(weight_floats());
      partials_ = Buffer<float>(static_cast<size_t>(problem_.threads) * weight_floats());
    }
    bind_products(mode);
  }

  // ---- forward ----
  std::vector<DumpTensor> dump_tensors() const override {
    const auto& s = problem_.shape;
    return {DumpTensor{"W1", {s.H, s.D, s.D}, W1_.data(), nullptr},
            DumpTensor{"W2", {s.H, s.D, n_blocks_}, W2_.data(), nullptr},
            DumpTensor{"P", {s.B, s.H, n_blocks_, n_blocks_}, P_.data(), nullptr}};
  }

 private:
  // Per-thread workspace, in floats (each array 64-byte aligned).
  struct Layout {
    size_t Kc = 0, Vc = 0, x = 0, hd = 0, S = 0, tmp = 0;                   // forward
    size_t dKc = 0, dVc = 0, dKs = 0, dVs = 0, dA = 0, states = 0, g = 0, dx = 0;  // backward
    size_t total = 0;
  };
  Layout layout(Mode mode) const {
    Layout L;
    const size_t N = static_cast<size_t>(problem_.shape.N), D = static_cast<size_t>(problem_.shape.D),
                 nb = static_cast<size_t>(n_blocks_), b = static_cast<size_t>(block_);
    size_t at = 0;
    auto take = [&at](size_t n) {
      const size_t o = at;
      at += (n + 15) / 16 * 16;
      return o;
    };
    L.Kc = take(N * D);
    L.Vc = take(N * D);
    L.x = take(nb * D);
    L.hd = take(nb * D);
    L.S = take(b * 2 * b);
    L.tmp = take(2 * nb);
    if (mode == Mode::fwdbwd) {
      L.dKc = take(N * D);
      L.dVc = take(N * D);
      L.dKs = take(N * D);
      L.dVs = take(N * D);
      L.dA = take(b * 2 * b);
      L.states = take(2 * static_cast<size_t>(iters_) * nb * nb + nb * nb);
      L.g = take(nb * nb);
      L.dx = take(nb * D);
    }
    L.total = at;
    return L;
  }
  size_t thread_floats(Mode mode) const { return layout(mode).total; }
  size_t persistent_floats(Mode mode) const {
    const auto& s = problem_.shape;
    // param_grads: the weights' gradients and one partial sum of them per thread.
    const size_t grads = problem_.param_grads && mode == Mode::fwdbwd ? (1 + static_cast<size_t>(problem_.threads)) * weight_floats() : 0;
    const size_t BH = static_cast<size_t>(s.B * s.H), N = static_cast<size_t>(s.N), D = static_cast<size_t>(s.D),
                 nb = static_cast<size_t>(n_blocks_);
    return static_cast<size_t>(s.H) * (D * D + D * nb)  // W1, W2
           + 2 * BH * nb * nb                            // P, R
           + BH * nb * D                                 // the network's pre-activations
           + 2 * BH * N * D                              // K~, V~
           + BH * N                                      // the attention's log-sum-exp
           + grads;
  }

  // ---- matrix product shapes (row-major; see MatmulSpec::tile) ----
  int64_t D() const { return problem_.shape.D; }
  int64_t BD() const { return block_ * problem_.shape.D; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(problem_.shape.D)); }
  // pre(nb, D) = x(nb, D) W1(D, D)
  MatmulSpec spec_xw1() const { return MatmulSpec::tile(n_blocks_, D(), D(), D(), false, D(), false, D()); }
  // R(nb, nb) = hd(nb, D) W2(D, nb)
  MatmulSpec spec_hw2() const { return MatmulSpec::tile(n_blocks_, n_blocks_, D(), D(), false, n_blocks_, false, n_blocks_); }
  // K~(nb, block·D) = P(nb, nb) Kc(nb, block·D)
  MatmulSpec spec_sort() const { return MatmulSpec::tile(n_blocks_, BD(), n_blocks_, n_blocks_, false, BD(), false, BD()); }
  // S(block, block) = scale · Q_i(block, D) K_i(block, D)^T, into a (block, 2·block) row
  MatmulSpec spec_qk() const {
    return MatmulSpec::tile(block_, block_, D(), problem_.strides.sn, false, D(), true, 2 * block_, scale());
  }
  // O_i(block, D) (+)= A(block, block) V(block, D)
  MatmulSpec spec_av(bool acc) const {
    return MatmulSpec::tile(block_, D(), block_, 2 * block_, false, D(), false, problem_.strides.sn, 1.0f, acc);
  }
  // backward:
  // dA(block, block) = dO_i(block, D) V(block, D)^T
  MatmulSpec spec_dav() const { return MatmulSpec::tile(block_, block_, D(), problem_.strides.sn, false, D(), true, 2 * block_); }
  // dQ_i (+)= scale · dS(block, block) K(block, D)
  MatmulSpec spec_dq(bool acc) const {
    return MatmulSpec::tile(block_, D(), block_, 2 * block_, false, D(), false, problem_.strides.sn, scale(), acc);
  }
  // dK(block, D) += scale · dS(block, block)^T Q_i(block, D)
  MatmulSpec spec_dk() const {
    return MatmulSpec::tile(block_, D(), block_, 2 * block_, true, problem_.strides.sn, false, D(), scale(), true);
  }
  // dV(block, D) += A(block, block)^T dO_i(block, D)
  MatmulSpec spec_dv() const {
    return MatmulSpec::tile(block_, D(), block_, 2 * block_, true, problem_.strides.sn, false, D(), 1.0f, true);
  }
  // dKc(nb, block·D) += P^T(nb, nb) dK~(nb, block·D)
  MatmulSpec spec_sort_back() const {
    return MatmulSpec::tile(n_blocks_, BD(), n_blocks_, n_blocks_, true, BD(), false, BD(), 1.0f, true);
  }
  // dP(nb, nb) (+)= dK~(nb, block·D) Kc(nb, block·D)^T
  MatmulSpec spec_dP(bool acc) const { return MatmulSpec::tile(n_blocks_, n_blocks_, BD(), BD(), false, BD(), true, n_blocks_, 1.0f, acc); }
  // dhd(nb, D) = dR(nb, nb) W2(D, nb)^T
  MatmulSpec spec_dhd() const { return MatmulSpec::tile(n_blocks_, D(), n_blocks_, n_blocks_, false, n_blocks_, true, D()); }
  // dW2(D, nb) += hd(nb, D)^T dR(nb, nb)
  MatmulSpec spec_dw2() const { return MatmulSpec::tile(D(), n_blocks_, n_blocks_, D(), true, n_blocks_, false, n_blocks_, 1.0f, true); }
  // dW1(D, D) += x(nb, D)^T dpre(nb, D)
  MatmulSpec spec_dw1() const { return MatmulSpec::tile(D(), D(), n_blocks_, D(), true, D(), false, D(), 1.0f, true); }
  // dx(nb, D) = dpre(nb, D) W1(D, D)^T
  MatmulSpec spec_dx() const { return MatmulSpec::tile(n_blocks_, D(), D(), D(), false, D(), true, D()); }

  std::vector<MatmulSpec> products(Mode mode) const override {
    std::vector<MatmulSpec> p = {spec_xw1(), spec_hw2(), spec_sort(), spec_qk(), spec_av(false), spec_av(true)};
    if (mode == Mode::fwdbwd)
      p.insert(p.end(), {spec_dav(), spec_dq(false), spec_dq(true), spec_dk(), spec_dv(), spec_sort_back(),
                         spec_dP(false), spec_dP(true), spec_dhd(), spec_dx()});
    if (mode == Mode::fwdbwd && problem_.param_grads) p.insert(p.end(), {spec_dw2(), spec_dw1()});
    return p;
  }

  float* work(int tid) const { return work_.data() + static_cast<size_t>(tid) * thread_floats(mode_); }
  size_t bh_index(int64_t b, int64_t h) const { return static_cast<size_t>(b * problem_.shape.H + h); }

  // The head's keys or values as a contiguous (nb, block·D) matrix: the tensor itself when its
  // rows are contiguous, else a copy into `buf`.
  const float* contiguous(const TensorView& t, int64_t b, int64_t h, float* buf) const {
    if (t.strides.sn == D()) return t.head(b, h);
    for (int64_t i = 0; i < problem_.shape.N; ++i) std::memcpy(buf + i * D(), t.row(b, h, i), static_cast<size_t>(D()) * sizeof(float));
    return buf;
  }

  // One normalisation pass in log space: every row (by_rows) or every column of L (nb x nb)
  // gets its log-sum-exp subtracted. Columns are swept row by row (contiguous, vectorised), with
  // the running maxima and sums in tmp (2·nb floats).
  void normalise(float* L, bool by_rows, float* tmp) const {
    const int64_t n = n_blocks_;
    if (by_rows) {
      for (int64_t i = 0; i < n; ++i) {
        float* row = L + i * n;
        const float m = max_of(row, n);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < n; ++j) sum += exp_f32(row[j] - m);
        const float lse = m + std::log(sum);
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) row[j] -= lse;
      }
      return;
    }
    float *mx = tmp, *sum = tmp + n;
    std::memcpy(mx, L, static_cast<size_t>(n) * sizeof(float));
    for (int64_t i = 1; i < n; ++i) {
      const float* row = L + i * n;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) mx[j] = std::max(mx[j], row[j]);
    }
    fill(sum, n, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = L + i * n;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) sum[j] += exp_f32(row[j] - mx[j]);
    }
    for (int64_t j = 0; j < n; ++j) mx[j] += std::log(sum[j]);
    for (int64_t i = 0; i < n; ++i) {
      float* row = L + i * n;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) row[j] -= mx[j];
    }
  }

  // Passes 1-3: summaries, sorting network, Sinkhorn. Leaves P (and R, pre) for this head.
  // x (nb, D): x_c = the mean of block c's query rows.
  void block_means(const AttnArgs& a, int64_t b, int64_t h, float* x) const {
    const int64_t Dd = D();
    for (int64_t c = 0; c < n_blocks_; ++c) {
      float* xc = x + c * Dd;
      fill(xc, Dd, 0.0f);
      for (int64_t r = 0; r < block_; ++r) {
        const float* q = a.q.row(b, h, c * block_ + r);
        for (int64_t d = 0; d < Dd; ++d) xc[d] += q[d];
      }
      scale_inplace(xc, Dd, 1.0f / static_cast<float>(block_));
    }
  }

  // ---- the sorting network's gradients (param_grads): W1 then W2, one layout ----
  size_t weights1() const { return static_cast<size_t>(problem_.shape.H * D() * D()); }
  size_t weight_floats() const { return weights1() + static_cast<size_t>(problem_.shape.H * D() * n_blocks_); }
  float* partial(int tid) const { return partials_.data() + static_cast<size_t>(tid) * weight_floats(); }
  void begin_param_grads() override { partials_.zero(); }
  void end_param_grads() override {
    const size_t n = weight_floats();
    std::memcpy(grads_.data(), partials_.data(), n * sizeof(float));
    for (int t = 1; t < problem_.threads; ++t) {
      const float* part = partial(t);
      float* g = grads_.data();
#pragma omp simd
      for (size_t i = 0; i < n; ++i) g[i] += part[i];
    }
  }

 public:
  std::vector<LearnedTensor> learned() override {
    const int64_t n1 = static_cast<int64_t>(weights1()), n2 = static_cast<int64_t>(weight_floats() - weights1());
    float* g = grads_.data();
    return {{"W1", W1_.data(), g, n1}, {"W2", W2_.data(), g ? g + n1 : nullptr, n2}};
  }

 private:
  void sort_matrix(const AttnArgs& a, int tid, int64_t b, int64_t h, float* x, float* hd, float* tmp) const {
    const int64_t nb = n_blocks_, Dd = D();
    const size_t bh = bh_index(b, h);
    // 1. x_c = mean of block c's query rows.
    block_means(a, b, h, x);
    // 2. R = relu(x W1) W2.
    float* pre = pre_.data() + bh * static_cast<size_t>(nb * Dd);
    mm_.run(tid, spec_xw1(), x, W1_.data() + h * Dd * Dd, pre);
    for (int64_t i = 0; i < nb * Dd; ++i) hd[i] = std::max(pre[i], 0.0f);
    float* R = R_.data() + bh * static_cast<size_t>(nb * nb);
    mm_.run(tid, spec_hw2(), hd, W2_.data() + h * Dd * nb, R);
    // 3. P = exp(L), L = R / temperature normalised by rows then columns, `iters` times.
    float* P = P_.data() + bh * static_cast<size_t>(nb * nb);
    for (int64_t i = 0; i < nb * nb; ++i) P[i] = R[i] / static_cast<float>(temperature_);
    for (int64_t t = 0; t < iters_; ++t) {
      normalise(P, true, tmp);
      normalise(P, false, tmp);
    }
#pragma omp simd
    for (int64_t i = 0; i < nb * nb; ++i) P[i] = exp_f32(P[i]);
  }

  void forward_head(const AttnArgs& a, int tid, int64_t b, int64_t h) const override {
    const Layout L = layout(mode_);
    float* w = work(tid);
    float* S = w + L.S;
    const int64_t nb = n_blocks_, Dd = D(), b2 = 2 * block_;
    const size_t bh = bh_index(b, h);
    sort_matrix(a, tid, b, h, w + L.x, w + L.hd, w + L.tmp);
    // 4. K~ = P Kc, V~ = P Vc (block-wise).
    const float* Kc = contiguous(a.k, b, h, w + L.Kc);
    const float* Vc = contiguous(a.v, b, h, w + L.Vc);
    const float* P = P_.data() + bh * static_cast<size_t>(nb * nb);
    float* Ks = Ks_.data() + bh * static_cast<size_t>(problem_.shape.N * Dd);
    float* Vs = Vs_.data() + bh * static_cast<size_t>(problem_.shape.N * Dd);
    mm_.run(tid, spec_sort(), P, Kc, Ks);
    mm_.run(tid, spec_sort(), P, Vc, Vs);
    // 5. Each query block attends [K_i ; K~_i]: logits, row softmax, output.
    float* lse = lse_.data() + bh * static_cast<size_t>(problem_.shape.N);
    for (int64_t i = 0; i < nb; ++i) {
      const int64_t r0 = i * block_;
      const float* Q = a.q.row(b, h, r0);
      mm_.run(tid, spec_qk(), Q, Kc + r0 * Dd, S);
      mm_.run(tid, spec_qk(), Q, Ks + r0 * Dd, S + block_);
      for (int64_t r = 0; r < block_; ++r) {
        float* Sr = S + r * b2;
        const float m = max_of(Sr, b2);
        const float sum = exp_shift_sum(Sr, Sr, b2, m);  // Sr <- exp(Sr - m), returns the sum
        scale_inplace(Sr, b2, 1.0f / sum);
        lse[r0 + r] = m + std::log(sum);
      }
      mm_.run(tid, spec_av(false), S, Vc + r0 * Dd, a.o.row(b, h, r0));
      mm_.run(tid, spec_av(true), S + block_, Vs + r0 * Dd, a.o.row(b, h, r0));
    }
  }

  // ---- backward ----
  void backward_head(const AttnArgs& a, int tid, int64_t b, int64_t h) const override {
    const Layout L = layout(mode_);
    float* w = work(tid);
    float *A = w + L.S, *dA = w + L.dA;
    float *dKc = w + L.dKc, *dVc = w + L.dVc, *dKs = w + L.dKs, *dVs = w + L.dVs;
    const int64_t nb = n_blocks_, Dd = D(), N = problem_.shape.N, b2 = 2 * block_;
    const size_t bh = bh_index(b, h);
    const float* Kc = contiguous(a.k, b, h, w + L.Kc);
    const float* Vc = contiguous(a.v, b, h, w + L.Vc);
    for (float* z : {dKc, dVc, dKs, dVs}) fill(z, N * Dd, 0.0f);
    const float* Ks = Ks_.data() + bh * static_cast<size_t>(N * Dd);
    const float* Vs = Vs_.data() + bh * static_cast<size_t>(N * Dd);
    const float* lse = lse_.data() + bh * static_cast<size_t>(N);

    // 1. The attention of each block: A = softmax(S) from the kept lse, dS = A (dA - rowsum(dO O)).
    for (int64_t i = 0; i < nb; ++i) {
      const int64_t r0 = i * block_;
      const float* Q = a.q.row(b, h, r0);
      const float* dO = a.dout.row(b, h, r0);
      mm_.run(tid, spec_qk(), Q, Kc + r0 * Dd, A);
      mm_.run(tid, spec_qk(), Q, Ks + r0 * Dd, A + block_);
      mm_.run(tid, spec_dav(), dO, Vc + r0 * Dd, dA);
      mm_.run(tid, spec_dav(), dO, Vs + r0 * Dd, dA + block_);
      for (int64_t r = 0; r < block_; ++r) {
        float* Ar = A + r * b2;
        float* dAr = dA + r * b2;
        const float delta = dot(a.dout.row(b, h, r0 + r), a.o.row(b, h, r0 + r), Dd);
        const float l = lse[r0 + r];
        exp_shift_sum(Ar, Ar, b2, l);
#pragma omp simd
        for (int64_t c = 0; c < b2; ++c) dAr[c] = Ar[c] * (dAr[c] - delta);
      }
      float* dQ = a.dq.row(b, h, r0);
      mm_.run(tid, spec_dq(false), dA, Kc + r0 * Dd, dQ);
      mm_.run(tid, spec_dq(true), dA + block_, Ks + r0 * Dd, dQ);
      mm_.run(tid, spec_dk(), dA, Q, dKc + r0 * Dd);
      mm_.run(tid, spec_dk(), dA + block_, Q, dKs + r0 * Dd);
      mm_.run(tid, spec_dv(), A, dO, dVc + r0 * Dd);
      mm_.run(tid, spec_dv(), A + block_, dO, dVs + r0 * Dd);
    }

    // 2. The sort: dKc += P^T dK~, dVc += P^T dV~, dP = dK~ Kc^T + dV~ Vc^T.
    const float* P = P_.data() + bh * static_cast<size_t>(nb * nb);
    float* g = w + L.g;
    mm_.run(tid, spec_sort_back(), P, dKs, dKc);
    mm_.run(tid, spec_sort_back(), P, dVs, dVc);
    mm_.run(tid, spec_dP(false), dKs, Kc, g);
    mm_.run(tid, spec_dP(true), dVs, Vc, g);

    // 3. Sinkhorn in reverse. Recompute the states: L0 = R / t, then each row and column pass's
    //    output. A pass y = x - lse(x) has dx = dy - exp(y) * sum(dy) along its direction.
    float* states = w + L.states;
    const float* R = R_.data() + bh * static_cast<size_t>(nb * nb);
    const int64_t nn = nb * nb;
    for (int64_t k = 0; k < nn; ++k) states[k] = R[k] / static_cast<float>(temperature_);
    for (int64_t t = 0; t < 2 * iters_; ++t) {
      float* next = states + (t + 1) * nn;
      std::memcpy(next, states + t * nn, static_cast<size_t>(nn) * sizeof(float));
      normalise(next, t % 2 == 0, w + L.tmp);
    }
    for (int64_t k = 0; k < nn; ++k) g[k] *= P[k];  // through P = exp(L)
    float* colsum = w + L.tmp;
    for (int64_t t = 2 * iters_ - 1; t >= 0; --t) {
      const float* y = states + (t + 1) * nn;
      if (t % 2 == 0) {  // a row pass
        for (int64_t i = 0; i < nb; ++i) {
          float* gi = g + i * nb;
          const float* yi = y + i * nb;
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < nb; ++j) sum += gi[j];
#pragma omp simd
          for (int64_t j = 0; j < nb; ++j) gi[j] -= exp_f32(yi[j]) * sum;
        }
      } else {  // a column pass
        std::memcpy(colsum, g, static_cast<size_t>(nb) * sizeof(float));
        for (int64_t i = 1; i < nb; ++i)
#pragma omp simd
          for (int64_t j = 0; j < nb; ++j) colsum[j] += g[i * nb + j];
        for (int64_t i = 0; i < nb; ++i)
#pragma omp simd
          for (int64_t j = 0; j < nb; ++j) g[i * nb + j] -= exp_f32(y[i * nb + j]) * colsum[j];
      }
    }
    scale_inplace(g, nn, 1.0f / static_cast<float>(temperature_));  // dR

    // 4. The network: dhd = dR W2^T, dpre = dhd (pre > 0), dx = dpre W1^T.
    float* dhd = w + L.hd;
    float* dx = w + L.dx;
    const float* pre = pre_.data() + bh * static_cast<size_t>(nb * Dd);
    mm_.run(tid, spec_dhd(), g, W2_.data() + h * Dd * nb, dhd);
    float* x = w + L.x;  // free in the backward pass
    if (problem_.param_grads) {  // dW2 += relu(pre)^T dR, into this thread's partial sum
      for (int64_t k = 0; k < nb * Dd; ++k) x[k] = std::max(pre[k], 0.0f);
      mm_.run(tid, spec_dw2(), x, g, partial(tid) + weights1() + h * Dd * nb);
    }
    for (int64_t k = 0; k < nb * Dd; ++k) dhd[k] = pre[k] > 0.0f ? dhd[k] : 0.0f;
    mm_.run(tid, spec_dx(), dhd, W1_.data() + h * Dd * Dd, dx);
    if (problem_.param_grads) {  // dW1 += x^T dpre, x the block means again
      block_means(a, b, h, x);
      mm_.run(tid, spec_dw1(), x, dhd, partial(tid) + h * Dd * Dd);
    }

    // 5. The block means: every query row of block c gets dx_c / block.
    const float inv = 1.0f / static_cast<float>(block_);
    for (int64_t c = 0; c < nb; ++c)
      for (int64_t r = 0; r < block_; ++r) {
        float* dq = a.dq.row(b, h, c * block_ + r);
        const float* dxc = dx + c * Dd;
        for (int64_t d = 0; d < Dd; ++d) dq[d] += inv * dxc[d];
      }
    for (int64_t i = 0; i < N; ++i) {
      std::memcpy(a.dk.row(b, h, i), dKc + i * Dd, static_cast<size_t>(Dd) * sizeof(float));
      std::memcpy(a.dv.row(b, h, i), dVc + i * Dd, static_cast<size_t>(Dd) * sizeof(float));
    }
  }

  int64_t block_, iters_;
  double temperature_;
  int64_t n_blocks_;
  Buffer<float> W1_, W2_, P_, R_, pre_, Ks_, Vs_, lse_, work_;
  Buffer<float> grads_, partials_;  // param_grads: dW1, dW2, and each thread's partial sums
};

}  // namespace

MechanismInfo sinkhorn_info() {
  MechanismInfo m;
  m.name = "sinkhorn";
  m.family = "routing";
  m.summary = "blocks sorted by a learned Sinkhorn-normalised permutation; each block attends itself and its sorted block";
  m.complexity = "O(N block D + N^2 D / block) time, O(N D + (N/block)^2) memory";
  m.caps = Capabilities{.exact = false, .causal = false, .backward = true, .decode = false,
                        .constraints = "N a multiple of block; not causal", .attn_dropout = false, .no_attn_dropout = "not implemented: its block softmax has no dropout mask"};
  m.params = {ParamSpec{"block", ParamType::Int, int64_t{64}, 1, 1 << 20, {}, "tokens per block (N must be a multiple)"},
              ParamSpec{"sinkhorn_iters", ParamType::Int, int64_t{8}, 0, 1000, {}, "rounds of row and column normalisation"},
              ParamSpec{"temperature", ParamType::Float, 0.75, 1e-3, 1e3, {}, "divides the sorting logits before normalisation"}};
  m.caps.no_additive_bias = "its sorted blocks are soft mixtures of the original blocks (a learned Sinkhorn permutation), so a key has no single position to take an offset from; not implemented";
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<Sinkhorn>(p, v); };
  m.reference = [](const Attention& impl, const AttnArgs& a, const AttnProblem&, const ParamValues& v) {
    return ref::sinkhorn(a.q, a.k, a.v, dump_tensor(impl, "W1").f32, dump_tensor(impl, "W2").f32, v.get_int("block"),
                         v.get_int("sinkhorn_iters"), v.get_float("temperature"));
  };
  return m;
}

std::vector<double> ref::sinkhorn_sort(const TensorView& q, int64_t b, int64_t h, const float* W1, const float* W2,
                                       int64_t block, int64_t iters, double temperature) {
  const int64_t D = q.shape.D, nb = q.shape.N / block;
  // 1. block summaries x (nb, D) and the network's logits R = relu(x W1) W2 / temperature (nb, nb)
  std::vector<double> L(static_cast<size_t>(nb * nb), 0.0);
  for (int64_t c = 0; c < nb; ++c) {
    std::vector<double> x(static_cast<size_t>(D), 0.0), hid(static_cast<size_t>(D), 0.0);
    for (int64_t r = 0; r < block; ++r)
      for (int64_t d = 0; d < D; ++d) x[d] += double(q.at(b, h, c * block + r, d)) / double(block);
    for (int64_t o = 0; o < D; ++o) {
      for (int64_t d = 0; d < D; ++d) hid[o] += x[d] * W1[(h * D + d) * D + o];
      hid[o] = std::max(hid[o], 0.0);
    }
    for (int64_t j = 0; j < nb; ++j) {
      for (int64_t o = 0; o < D; ++o) L[c * nb + j] += hid[o] * W2[(h * D + o) * nb + j];
      L[c * nb + j] /= temperature;
    }
  }
  // 2. rows, then columns, each minus its log-sum-exp, `iters` times; P = exp(L)
  auto normalise = [&](bool rows) {
    for (int64_t u = 0; u < nb; ++u) {
      auto at = [&](int64_t t) -> double& { return rows ? L[u * nb + t] : L[t * nb + u]; };
      double mx = -1e300, sum = 0;
      for (int64_t t = 0; t < nb; ++t) mx = std::max(mx, at(t));
      for (int64_t t = 0; t < nb; ++t) sum += std::exp(at(t) - mx);
      for (int64_t t = 0; t < nb; ++t) at(t) -= mx + std::log(sum);
    }
  };
  for (int64_t it = 0; it < iters; ++it) {
    normalise(true);
    normalise(false);
  }
  for (auto& x : L) x = std::exp(x);
  return L;
}

std::vector<double> ref::sinkhorn(const TensorView& q, const TensorView& k, const TensorView& v, const float* W1,
                                  const float* W2, int64_t block, int64_t iters, double temperature) {
  const Shape4& s = q.shape;
  const int64_t nb = s.N / block;
  std::vector<double> out(static_cast<size_t>(s.numel()));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const auto P = sinkhorn_sort(q, b, h, W1, W2, block, iters, temperature);
      for (int64_t i = 0; i < nb; ++i) {
        // keys and values (2 block, D): block i itself, then its sorted block
        Rows keys(static_cast<size_t>(2 * block), std::vector<double>(static_cast<size_t>(s.D), 0.0)), vals = keys;
        for (int64_t r = 0; r < block; ++r)
          for (int64_t d = 0; d < s.D; ++d) {
            keys[r][d] = k.at(b, h, i * block + r, d);
            vals[r][d] = v.at(b, h, i * block + r, d);
            for (int64_t c = 0; c < nb; ++c) {
              keys[block + r][d] += P[i * nb + c] * k.at(b, h, c * block + r, d);
              vals[block + r][d] += P[i * nb + c] * v.at(b, h, c * block + r, d);
            }
          }
        // block i's queries alone: a (1, 1, block, D) view
        const TensorView rows{q.row(b, h, i * block), Shape4{1, 1, block, s.D}, q.strides};
        const auto o = attend(rows, 0, 0, keys, vals);
        for (int64_t r = 0; r < block; ++r)
          for (int64_t d = 0; d < s.D; ++d) out[idx(s, b, h, i * block + r, d)] = o[r * s.D + d];
      }
    }
  return out;
}

}  // namespace ab
