// routing: the Routing Transformer's k-means routed attention.
// Paper: Roy, Saffar, Vaswani, Grangier 2021 (arXiv 2020), "Efficient Content-Based Sparse
//   Attention with Routing Transformers" (TACL). References read: google-research
//   routing_transformer, lucidrains/routing-transformer (KmeansAttention).
// Computes (per batch row and head; docs/mechanisms.md):
//   Shared query-key as in reformer: the keys are K_j = Q_j/||Q_j|| (the K input is not used; dK
//   is zero), and the routing vector of a position is x_i = Q_i/||Q_i||. The head has k
//   centroids mu_c (clusters, default round(sqrt(N)); unit vectors at setup); dist(i, c) = x_i . mu_c.
//   Not causal: each centroid takes its top-`window` positions by dist (default ceil(N/k), so
//   the clusters are equal-sized and together cover about N; ties to the earlier position); the
//   members of a cluster attend each other. A position in no cluster gets a zero output; one in
//   several combines them by their log-sum-exp, one softmax over the union, as reformer combines
//   its rounds.
//   Causal: top-window membership depends on every position (a later token can push an earlier
//   one out of a cluster), so a causal query would see the future through it: the prefix check
//   measures it. Causal routing therefore puts each position in the cluster of its nearest
//   centroid (argmax dist, a function of the position alone) and lets it attend the last
//   `window` members of that cluster up to itself: equal-sized windows, each query's keys a
//   function of positions <= i.
//   In both, a query never attends its own position unless it has no other admissible key (the
//   shared query-key rule: q_i . k_i would dominate), and logits are q_i . K_j / sqrt(D).
// Complexity: routing 2·N·k·D (a product) plus O(N·k) for the selection; attention over
//   k·window² pairs (not causal) or N·2·window logits (causal, tiles of window queries against
//   the previous and own window of their cluster): O(N^1.5 D) at the defaults. Memory O(N·k)
//   per thread (the routing scores) plus O(N·D) for backward.
// Backward: a query's output is one softmax over the union of its tiles with normaliser L_i, so
//   each tile recomputes its logits and applies the flash-style backward with the global L_i and
//   delta_i = dO_i . O_i; the keys' gradients flow into dQ through the normalisation. The
//   routing is piecewise constant: no gradient reaches the centroids.
// Training: the centroids are drawn at setup (standard normal, normalised, seeded) and updated in
//   a training forward, after it routed, by online k-means: per head,
//   mu_c <- decay·mu_c + (1 - decay)·m_c, m_c the normalised sum over the batch of the routing
//   vectors whose nearest centroid is c (unchanged when none is): the paper's exponential moving
//   average, decay 0.999. They are state, not parameters: no gradient, no optimiser;
//   checkpoints and the best-validation copy hold them, evaluation keeps them fixed.
// Optimises: every cluster is one tile: its queries, keys and values gathered into contiguous
//   buffers, logits and output two oneDNN products, backward four more; the routing scores one
//   product per head; (batch, head) pairs run in parallel.
// Leaves out: the paper's mixing of routing heads with local-attention heads (run `local` or
//   `sliding` beside it), the commitment loss of lucidrains' implementation (the paper trains
//   the centroids by the moving average alone), k-means initialisation of the centroids from
//   the first batch (lucidrains; here seeded random unit vectors), separate query and key
//   clustering, attention dropout, additive position encodings, a decode step, and a bf16 path:
//   its tiles are its own gathered products, not the engine's, so a bf16 training step runs it
//   in float32 (the result's note says so).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <vector>

#include "attention_impls/lsh_hash.hpp"  // inverse_norms
#include "attention_impls/per_head_attention.hpp"
#include "attention_impls/registry.hpp"
#include "attention_impls/shared_qk.hpp"
#include "core/matmul.hpp"
#include "core/vecmath.hpp"  // and <immintrin.h> on AVX2 + FMA and AVX-512 builds

namespace ab {
namespace {

// Rows a gather asks for ahead of the one it copies (as reformer's gathers).
constexpr int64_t kGatherAhead = 16;

int64_t default_clusters(int64_t N) {
  return std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(N))));
}

class Routing final : public PerHeadAttention {
 public:
  Routing(const AttnProblem& p, const ParamValues& v)
      : PerHeadAttention(p),
        k_(v.get_int("clusters") > 0 ? v.get_int("clusters") : default_clusters(p.shape.N)),
        w_(v.get_int("window") > 0 ? v.get_int("window") : (p.shape.N + k_ - 1) / k_),
        decay_(static_cast<float>(v.get_float("decay"))) {}

  void validate() const override {
    const int64_t N = problem_.shape.N;
    if (k_ > N)
      throw InvalidInput("routing: clusters=" + std::to_string(k_) + " is more than N=" + std::to_string(N));
    if (w_ > N) throw InvalidInput("routing: window=" + std::to_string(w_) + " is more than N=" + std::to_string(N));
  }

  double flops(Mode mode) const override {
    const auto& s = problem_.shape;
    const double N = static_cast<double>(s.N), D = static_cast<double>(s.D);
    const double route = 2.0 * N * static_cast<double>(k_) * D;
    const double pairs = problem_.causal ? N * 2.0 * static_cast<double>(w_) : static_cast<double>(k_ * w_ * w_);
    const double attention = attention_pair_flops(pairs, s.D);
    return (route + (mode == Mode::fwd ? attention : 3.5 * attention)) * static_cast<double>(s.B * s.H);
  }

  size_t working_bytes(Mode mode) const override {
    plan(mode);
    const Layout L = layout(mode);
    return persistent_bytes(mode) +
           static_cast<size_t>(problem_.threads) * (L.floats * sizeof(float) + L.ints * sizeof(int32_t)) + scratchpad_bytes();
  }

  void setup(Mode mode, Rng& rng) override {
    plan(mode);
    const auto& s = problem_.shape;
    centroids_ = Buffer<float>(static_cast<size_t>(s.H * k_ * s.D));
    rng.fill_normal(centroids_.data(), static_cast<int64_t>(centroids_.size()));
    for (int64_t c = 0; c < s.H * k_; ++c) {
      float* m = centroids_.data() + c * s.D;
      const float n = std::sqrt(dot(m, m, s.D));
      scale_inplace(m, s.D, n > 0 ? 1.0f / n : 0.0f);
    }
    assignment_ = Buffer<int64_t>(static_cast<size_t>(s.B * s.H * s.N));
    if (!problem_.causal) members_ = Buffer<int64_t>(static_cast<size_t>(s.B * s.H * k_ * w_));
    lse_ = Buffer<float>(static_cast<size_t>(s.B * s.H * s.N));
    if (mode == Mode::fwdbwd) {  // the moving average's sums (a training step runs backward)
      sums_ = Buffer<float>(static_cast<size_t>(s.B * s.H * k_ * s.D));
      counts_ = Buffer<int64_t>(static_cast<size_t>(s.B * s.H * k_));
    }
    const Layout L = layout(mode);
    work_floats_ = Buffer<float>(static_cast<size_t>(problem_.threads) * L.floats);
    work_ints_ = Buffer<int32_t>(static_cast<size_t>(problem_.threads) * L.ints);
    bind_products(mode);
  }

  void set_training(bool on) override {
    if (on && mode_ != Mode::fwdbwd) throw std::logic_error("routing: training needs a setup with backward");
    training_ = on;
  }
  std::vector<LearnedTensor> updated_state() override {
    return {LearnedTensor{"centroids", centroids_.data(), nullptr, problem_.shape.H * k_ * problem_.shape.D}};
  }

  // Routing (and, in training, the centroids' update) then the heads.
  void forward(const AttnArgs& a) override {
    PerHeadAttention::forward(a);
    if (training_) update_centroids();
  }

  std::vector<DumpTensor> dump_tensors() const override {
    const auto& s = problem_.shape;
    std::vector<DumpTensor> t = {DumpTensor{"centroids", {s.H, k_, s.D}, centroids_.data(), nullptr},
                                 DumpTensor{"assignment", {s.B, s.H, s.N}, nullptr, assignment_.data()}};
    if (!problem_.causal) t.push_back(DumpTensor{"members", {s.B, s.H, k_, w_}, nullptr, members_.data()});
    return t;
  }
  std::string dump_note() const override {
    return "shared query-key: the keys are Q_j/||Q_j||; the K input is not used and dk is zero; the centroids are the "
           "ones this forward routed with (not updated: dump does not train)";
  }

 private:
  // Keys of a tile: the cluster's members (not causal), or the previous and own window of the
  // cluster's position-ordered list (causal).
  int64_t keys() const { return problem_.causal ? 2 * w_ : w_; }

  struct Layout {
    size_t inv = 0, dist = 0, Qt = 0, Kt = 0, Vt = 0, S = 0, Oc = 0, M = 0, Z = 0, score = 0, lt = 0;  // forward
    size_t dOt = 0, dA = 0, dKt = 0, dVt = 0, dKn = 0, delta = 0;                           // backward
    size_t qpos = 0, kpos = 0, order = 0, count = 0;                                        // int32
    size_t floats = 0, ints = 0;
  };
  Layout layout(Mode mode) const {
    Layout L;
    const size_t N = static_cast<size_t>(problem_.shape.N), D = static_cast<size_t>(problem_.shape.D), k = static_cast<size_t>(k_),
                 w = static_cast<size_t>(w_), W = static_cast<size_t>(keys());
    size_t at = 0;
    auto take = [&at](size_t n) {
      const size_t o = at;
      at += (n + 15) / 16 * 16;
      return o;
    };
    L.inv = take(N);
    L.dist = take(k * N);
    L.Qt = take(w * D);
    L.Kt = take(W * D);
    L.Vt = take(W * D);
    L.S = take(w * W);
    L.Oc = take(w * D);
    L.M = take(N);
    L.Z = take(N);
    L.score = take(2 * N);  // a centroid's candidates, and a copy to select from
    L.lt = take(w);  // a tile's log-sum-exp per query row
    if (mode == Mode::fwdbwd) {
      L.dOt = take(w * D);
      L.dA = take(w * W);
      L.dKt = take(W * D);
      L.dVt = take(W * D);
      L.dKn = take(N * D);
      L.delta = take(N);
    }
    L.floats = at;
    at = 0;
    L.qpos = take(w);
    L.kpos = take(W);
    L.order = take(N);  // the clusters' lists (causal), a centroid's candidates' positions
    L.count = take(k + 1);
    L.ints = at;
    return L;
  }
  size_t persistent_bytes(Mode mode) const {
    const auto& s = problem_.shape;
    size_t b = static_cast<size_t>(s.H * k_ * s.D) * sizeof(float)      // centroids
               + static_cast<size_t>(s.B * s.H * s.N) * sizeof(int64_t)  // assignment
               + static_cast<size_t>(s.B * s.H * s.N) * sizeof(float);   // L, for backward
    if (!problem_.causal) b += static_cast<size_t>(s.B * s.H * k_ * w_) * sizeof(int64_t);  // members
    if (mode == Mode::fwdbwd)
      b += static_cast<size_t>(s.B * s.H * k_ * s.D) * sizeof(float) + static_cast<size_t>(s.B * s.H * k_) * sizeof(int64_t);
    return b;
  }

  // ---- matrix product shapes (row-major; see MatmulSpec::tile) ----
  int64_t D() const { return problem_.shape.D; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(problem_.shape.D)); }
  // dist(k, N) = mu(k, D) Q(N, D)^T, Q read in place (row stride sn); columns scaled by 1/||Q_i|| after.
  MatmulSpec spec_route() const { return MatmulSpec::tile(k_, problem_.shape.N, D(), D(), false, problem_.strides.sn, true, problem_.shape.N); }
  // S(w, W) = scale · Qt(w, D) Kt(W, D)^T
  MatmulSpec spec_qk() const { return MatmulSpec::tile(w_, keys(), D(), D(), false, D(), true, keys(), scale()); }
  // Oc(w, D) = P(w, W) Vt(W, D)
  MatmulSpec spec_av() const { return MatmulSpec::tile(w_, D(), keys(), keys(), false, D(), false, D()); }
  // dA(w, W) = dOt(w, D) Vt(W, D)^T
  MatmulSpec spec_dav() const { return MatmulSpec::tile(w_, keys(), D(), D(), false, D(), true, keys()); }
  // dQt(w, D) = scale · dS(w, W) Kt(W, D)   (into Oc)
  MatmulSpec spec_dq() const { return MatmulSpec::tile(w_, D(), keys(), keys(), false, D(), false, D(), scale()); }
  // dKt(W, D) = scale · dS^T(W, w) Qt(w, D)
  MatmulSpec spec_dk() const { return MatmulSpec::tile(keys(), D(), w_, keys(), true, D(), false, D(), scale()); }
  // dVt(W, D) = P^T(W, w) dOt(w, D)
  MatmulSpec spec_dv() const { return MatmulSpec::tile(keys(), D(), w_, keys(), true, D(), false, D()); }

  std::vector<MatmulSpec> products(Mode mode) const override {
    std::vector<MatmulSpec> p = {spec_route(), spec_qk(), spec_av()};
    if (mode == Mode::fwdbwd) p.insert(p.end(), {spec_dav(), spec_dq(), spec_dk(), spec_dv()});
    return p;
  }

  float* work_floats(int tid) const { return work_floats_.data() + static_cast<size_t>(tid) * layout(mode_).floats; }
  int32_t* work_ints(int tid) const { return work_ints_.data() + static_cast<size_t>(tid) * layout(mode_).ints; }
  int64_t* assignment_of(int64_t b, int64_t h) const { return assignment_.data() + (b * problem_.shape.H + h) * problem_.shape.N; }
  int64_t* members_of(int64_t b, int64_t h) const { return members_.data() + (b * problem_.shape.H + h) * k_ * w_; }

  // 1. Routing: the scores dist(c, i) = mu_c . x_i (centroid-major, so each centroid's scores
  //    are one contiguous row), every position's nearest centroid (first on ties) and, not
  //    causal, each centroid's top-window positions in position order. The selection finds the
  //    window-th largest score t of the row (nth_element on a copy of the floats), then takes, in
  //    position order, the scores above t and the earliest of those equal to t: O(N) a centroid,
  //    no sort.
  void route(const AttnArgs& a, int tid, int64_t b, int64_t h) const {
    const Layout L = layout(mode_);
    float *w = work_floats(tid), *inv = w + L.inv, *dist = w + L.dist, *score = w + L.score;
    const int64_t N = problem_.shape.N;
    inverse_norms(a.q.row(b, h, 0), problem_.strides.sn, N, D(), inv);
    mm_.run(tid, spec_route(), centroids_.data() + h * k_ * D(), a.q.row(b, h, 0), dist);
    int64_t* assign = assignment_of(b, h);
    for (int64_t c = 0; c < k_; ++c) {
      float* row = dist + c * N;
#pragma omp simd
      for (int64_t i = 0; i < N; ++i) row[i] = inv[i] > 0 ? row[i] * inv[i] : 0.0f;  // a zero or non-finite row scores 0
    }
    std::copy_n(dist, N, score);  // the best score so far
    std::fill(assign, assign + N, 0);
    for (int64_t c = 1; c < k_; ++c) {
      const float* row = dist + c * N;
#pragma omp simd
      for (int64_t i = 0; i < N; ++i) {
        const bool better = row[i] > score[i];
        score[i] = better ? row[i] : score[i];
        assign[i] = better ? c : assign[i];
      }
    }
    if (problem_.causal) return;
    int64_t* mem = members_of(b, h);
    int32_t* at = work_ints(tid) + L.order;
    for (int64_t c = 0; c < k_; ++c) select_window(dist + c * N, score, at, mem + c * w_);
  }

  // A centroid's members: the positions of the window largest of the N finite scores of its
  // row, the earliest first among equal scores, in position order (scratch: 2N floats, N ints).
  // A full nth_element costs ~7 ns a score, most of the forward call; instead a sample of every
  // kSampleStride-th score gives a bound t0 that about twice the window's share of the sample
  // exceeds, one branch-free pass keeps the scores >= t0 and their positions (about 2·window of
  // them, in position order), and the selection runs on those. When fewer than window pass (a
  // sample that overshot, or window near N), it runs on the whole row: exact either way.
  void select_window(const float* row, float* val, int32_t* pos, int64_t* members) const {
    constexpr int64_t kSampleStride = 8;
    const int64_t N = problem_.shape.N, m = (N + kSampleStride - 1) / kSampleStride;
    const int64_t r = std::min(m, 2 * w_ / kSampleStride + 8);  // the sample's rank taken as t0
    // The r-th largest of the sample: a min-heap of the r largest so far (most of the sample
    // fails the one comparison with its root).
    float* heap = val;
    for (int64_t j = 0; j < r; ++j) heap[j] = row[j * kSampleStride];
    std::make_heap(heap, heap + r, std::greater<float>());
    for (int64_t j = r; j < m; ++j) {
      const float x = row[j * kSampleStride];
      if (!(x > heap[0])) continue;
      std::pop_heap(heap, heap + r, std::greater<float>());
      heap[r - 1] = x;
      std::push_heap(heap, heap + r, std::greater<float>());
    }
    const float t0 = heap[0];
    int64_t n = 0, i = 0;
    // About 3% of the scores pass: test a vector of them at a time, and take the passing ones
    // by their bits.
#if defined(__AVX512F__)
    const __m512 tv = _mm512_set1_ps(t0);
    for (; i + 16 <= N; i += 16)
      for (uint32_t bits = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + i), tv, _CMP_GE_OQ); bits; bits &= bits - 1) {
        const int64_t at = i + __builtin_ctz(bits);
        val[n] = row[at];
        pos[n++] = static_cast<int32_t>(at);
      }
#elif defined(__AVX2__)
    const __m256 tv = _mm256_set1_ps(t0);
    for (; i + 8 <= N; i += 8)
      for (uint32_t bits = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + i), tv, _CMP_GE_OQ)));
           bits; bits &= bits - 1) {
        const int64_t at = i + __builtin_ctz(bits);
        val[n] = row[at];
        pos[n++] = static_cast<int32_t>(at);
      }
#endif
    for (; i < N; ++i)
      if (row[i] >= t0) {
        val[n] = row[i];
        pos[n++] = static_cast<int32_t>(i);
      }
    if (n < w_) {
      for (int64_t i = 0; i < N; ++i) {
        val[i] = row[i];
        pos[i] = static_cast<int32_t>(i);
      }
      n = N;
    }
    // The threshold: the window-th largest candidate, selected on a copy (the candidates stay in
    // position order).
    float* sorted = val + N;
    std::copy_n(val, n, sorted);
    std::nth_element(sorted, sorted + (n - w_), sorted + n);  // finite scores: a strict weak order
    const float t = sorted[n - w_];
    int64_t above = 0;
    for (int64_t x = 0; x < n; ++x) above += val[x] > t;
    int64_t ties = w_ - above, taken = 0;
    for (int64_t x = 0; x < n && taken < w_; ++x)
      if (val[x] > t || (val[x] == t && ties-- > 0)) members[taken++] = pos[x];
  }

  // The clusters' position-ordered lists (causal): list[count[c], count[c + 1]) holds cluster
  // c's positions, a counting sort of the assignment.
  void cluster_lists(const int64_t* assign, int32_t* list, int32_t* count) const {
    std::fill(count, count + k_ + 1, 0);
    for (int64_t i = 0; i < problem_.shape.N; ++i) ++count[assign[i] + 1];
    for (int64_t c = 0; c < k_; ++c) count[c + 1] += count[c];
    for (int64_t i = 0; i < problem_.shape.N; ++i) list[count[assign[i]]++] = static_cast<int32_t>(i);
    for (int64_t c = k_; c > 0; --c) count[c] = count[c - 1];  // count[c] was advanced to the end of c
    count[0] = 0;
  }

  // The tiles of a head, in order: tile t's query positions qpos[w] and key positions kpos[W]
  // (-1 marks padding). Calls f(qpos, kpos) for each.
  // Before a tile runs, the rows of the next tile's queries in the given tensors are asked for
  // into L2 (they are random rows of the head: their misses overlap this tile's arithmetic).
  // The tiles' queries are consecutive runs of one array (the members, or the clusters' lists),
  // so the next ones are the w positions after this tile's.
  template <class Pos>
  void prefetch_next(std::initializer_list<const TensorView*> tensors, int64_t b, int64_t h, const Pos* next,
                     int64_t n) const {
    for (int64_t x = 0; x < n; ++x)
      for (const TensorView* t : tensors) prefetch_l2(t->row(b, h, next[x]), D());
  }

  template <class F>
  void for_each_tile(int64_t b, int64_t h, int tid, std::initializer_list<const TensorView*> ahead, F&& f) const {
    const Layout L = layout(mode_);
    int32_t *wi = work_ints(tid), *qpos = wi + L.qpos, *kpos = wi + L.kpos;
    if (!problem_.causal) {
      const int64_t* mem = members_of(b, h);
      for (int64_t c = 0; c < k_; ++c) {
        for (int64_t t = 0; t < w_; ++t) qpos[t] = kpos[t] = static_cast<int32_t>(mem[c * w_ + t]);
        if (c + 1 < k_) prefetch_next(ahead, b, h, mem + (c + 1) * w_, w_);
        f(qpos, kpos);
      }
      return;
    }
    int32_t *list = wi + L.order, *count = wi + L.count;
    cluster_lists(assignment_of(b, h), list, count);
    for (int64_t c = 0; c < k_; ++c) {
      const int64_t n = count[c + 1] - count[c];
      const int32_t* lc = list + count[c];
      for (int64_t t0 = 0; t0 < n; t0 += w_) {
        for (int64_t s = 0; s < w_; ++s) {
          kpos[s] = t0 > 0 ? lc[t0 - w_ + s] : -1;
          kpos[w_ + s] = qpos[s] = t0 + s < n ? lc[t0 + s] : -1;
        }
        const int64_t next = count[c] + std::min(t0 + w_, n);  // the next tile's first query in list
        prefetch_next(ahead, b, h, list + next, std::min(w_, problem_.shape.N - next));
        f(qpos, kpos);
      }
    }
  }

  // Rows of a (B, H, N, D) tensor at positions pos[0, rows) (a padding row, -1, reads row 0),
  // asking for the row kGatherAhead places ahead as it copies (the rows are random rows of the
  // head, missing L1 and often L2).
  void gather(const TensorView& t, int64_t b, int64_t h, const int32_t* pos, int64_t rows, float* dst) const {
    const int64_t Dd = D();
    for (int64_t p = 0; p < rows; ++p) {
      if (p + kGatherAhead < rows) prefetch(t.row(b, h, std::max(pos[p + kGatherAhead], 0)), Dd);
      const float* src = t.row(b, h, std::max(pos[p], 0));
      float* d = dst + p * Dd;
#pragma omp simd
      for (int64_t c = 0; c < Dd; ++c) d[c] = src[c];
    }
  }
  // A tile's queries Qt (raw Q rows) and keys Kt (the same rows normalised, Q_j/||Q_j||). The
  // queries are the tile's last w key slots (all of them when not causal): those keys are
  // scaled copies of the queries just gathered; only a causal tile's previous window is
  // gathered again.
  void gather_queries_and_keys(const AttnArgs& a, int64_t b, int64_t h, const int32_t* qpos, const int32_t* kpos,
                               const float* inv, float* Qt, float* Kt) const {
    const int64_t Dd = D(), prev = keys() - w_;
    gather(a.q, b, h, qpos, w_, Qt);
    gather(a.q, b, h, kpos, prev, Kt);
    for (int64_t s = 0; s < keys(); ++s) {
      const int32_t j = std::max(kpos[s], 0);
      const float* src = s < prev ? Kt + s * Dd : Qt + (s - prev) * Dd;
      scale_copy(src, Dd, inv[j], Kt + s * Dd);
    }
  }
  static void scale_copy(const float* x, int64_t n, float a, float* y) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = a * x[i];
  }

  // Masks a tile's logits S (w x W): causal, keys outside the query's window of its cluster (key
  // slot s is admissible for query row r when r < s <= r + w) and the previous window's slots
  // when the tile is its cluster's first (they are padding, -1); then the query's own slot
  // (r + w causal, r not) unless no other key is admissible. A tile's keys are distinct
  // positions, so the slots say it all; padding query rows are left as they are (never used).
  void mask_tile(float* S, const int32_t* qpos, const int32_t* kpos) const {
    const int64_t W = keys();
    const int64_t first = problem_.causal && kpos[0] < 0 ? w_ : 0;  // the previous window is all or nothing
    for (int64_t r = 0; r < w_; ++r) {
      if (qpos[r] < 0) continue;
      float* row = S + r * W;
      const int64_t lo = problem_.causal ? std::max(r + 1, first) : 0, hi = problem_.causal ? r + w_ + 1 : W;  // [lo, hi)
      fill(row, lo, kNegInf);
      fill(row + hi, W - hi, kNegInf);
      if (hi - lo > 1) row[problem_.causal ? r + w_ : r] = kNegInf;
    }
  }

  void forward_head(const AttnArgs& a, int tid, int64_t b, int64_t h) const override {
    const Layout L = layout(mode_);
    float* w = work_floats(tid);
    float *inv = w + L.inv, *Qt = w + L.Qt, *Kt = w + L.Kt, *Vt = w + L.Vt, *S = w + L.S, *Oc = w + L.Oc;
    float *M = w + L.M, *Z = w + L.Z, *lt = w + L.lt;
    const int64_t N = problem_.shape.N, Dd = D(), W = keys();
    route(a, tid, b, h);
    if (training_) accumulate_sums(b, h, inv, a);
    for (int64_t i = 0; i < N; ++i) fill(a.o.row(b, h, i), Dd, 0.0f);
    fill(M, N, kNegInf);
    fill(Z, N, 0.0f);
    // 2. Each tile: gather, logits, mask, softmax (its log-sum-exp kept), output, and an online
    //    merge into O: O_i holds sum_t exp(lse_t - M_i)·O_t,i, Z_i the sum of the weights.
    for_each_tile(b, h, tid, {&a.q, &a.v}, [&](const int32_t* qpos, const int32_t* kpos) {
      gather_queries_and_keys(a, b, h, qpos, kpos, inv, Qt, Kt);
      gather(a.v, b, h, kpos, W, Vt);
      mm_.run(tid, spec_qk(), Qt, Kt, S);
      mask_tile(S, qpos, kpos);
      for (int64_t r = 0; r < w_; ++r) {
        float* Sr = S + r * W;
        if (qpos[r] < 0) {  // padding: a zero row, so the product stays finite
          fill(Sr, W, 0.0f);
          continue;
        }
        const float m = max_of(Sr, W);
        const float sum = exp_shift_sum(Sr, Sr, W, m);
        scale_inplace(Sr, W, 1.0f / sum);
        lt[r] = m + std::log(sum);
      }
      mm_.run(tid, spec_av(), S, Vt, Oc);
      for (int64_t r = 0; r < w_; ++r) {
        const int32_t i = qpos[r];
        if (i >= 0) merge_by_lse(a.o.row(b, h, i), Oc + r * Dd, Dd, lt[r], 1.0f, M[i], Z[i]);
      }
    });
    // 3. Normalise, and keep L_i = M_i + log Z_i for backward (-inf for a position in no
    //    cluster, whose output stays zero).
    float* lse = lse_.data() + (b * problem_.shape.H + h) * N;
    for (int64_t i = 0; i < N; ++i) {
      if (Z[i] > 0) scale_inplace(a.o.row(b, h, i), Dd, 1.0f / Z[i]);
      lse[i] = Z[i] > 0 ? M[i] + std::log(Z[i]) : kNegInf;
    }
  }

  // ---- backward (see the opening comment) ----
  void backward_head(const AttnArgs& a, int tid, int64_t b, int64_t h) const override {
    const Layout L = layout(mode_);
    float* w = work_floats(tid);
    float *inv = w + L.inv, *Qt = w + L.Qt, *Kt = w + L.Kt, *Vt = w + L.Vt, *A = w + L.S, *dQt = w + L.Oc;
    float *dOt = w + L.dOt, *dA = w + L.dA, *dKt = w + L.dKt, *dVt = w + L.dVt, *dKn = w + L.dKn, *delta = w + L.delta;
    const int64_t N = problem_.shape.N, Dd = D(), W = keys();
    const float* lse = lse_.data() + (b * problem_.shape.H + h) * N;
    inverse_norms(a.q.row(b, h, 0), problem_.strides.sn, N, Dd, inv);
    for (int64_t i = 0; i < N; ++i) {
      delta[i] = dot(a.dout.row(b, h, i), a.o.row(b, h, i), Dd);
      fill(a.dq.row(b, h, i), Dd, 0.0f);
      fill(a.dk.row(b, h, i), Dd, 0.0f);  // K is not an input of the mechanism
      fill(a.dv.row(b, h, i), Dd, 0.0f);
    }
    fill(dKn, N * Dd, 0.0f);
    for_each_tile(b, h, tid, {&a.q, &a.v, &a.dout}, [&](const int32_t* qpos, const int32_t* kpos) {
      // 1. The tile's queries, keys, values and upstream gradient.
      gather_queries_and_keys(a, b, h, qpos, kpos, inv, Qt, Kt);
      gather(a.v, b, h, kpos, W, Vt);
      gather(a.dout, b, h, qpos, w_, dOt);
      // 2. A = exp(S - L) (the combined softmax's share of this tile), dS = A (dA - delta).
      mm_.run(tid, spec_qk(), Qt, Kt, A);
      mask_tile(A, qpos, kpos);
      mm_.run(tid, spec_dav(), dOt, Vt, dA);
      for (int64_t r = 0; r < w_; ++r) {
        float *Ar = A + r * W, *dAr = dA + r * W;
        if (qpos[r] < 0) {  // padding: no share, no gradient
          fill(Ar, W, 0.0f);
          fill(dAr, W, 0.0f);
          continue;
        }
        exp_shift_sum(Ar, Ar, W, lse[qpos[r]]);
        const float dl = delta[qpos[r]];
#pragma omp simd
        for (int64_t s = 0; s < W; ++s) dAr[s] = Ar[s] * (dAr[s] - dl);
      }
      // 3. dQ of the queries, dK~ and dV of the keys, scattered by position.
      mm_.run(tid, spec_dq(), dA, Kt, dQt);
      mm_.run(tid, spec_dk(), dA, Qt, dKt);
      mm_.run(tid, spec_dv(), A, dOt, dVt);
      for (int64_t r = 0; r < w_; ++r) {
        if (qpos[r] < 0) continue;
        float* dq = a.dq.row(b, h, qpos[r]);
        const float* g = dQt + r * Dd;
#pragma omp simd
        for (int64_t d = 0; d < Dd; ++d) dq[d] += g[d];
      }
      for (int64_t s = 0; s < W; ++s) {
        if (kpos[s] < 0) continue;
        float *dk = dKn + static_cast<int64_t>(kpos[s]) * Dd, *dv = a.dv.row(b, h, kpos[s]);
        const float *gk = dKt + s * Dd, *gv = dVt + s * Dd;
#pragma omp simd
        for (int64_t d = 0; d < Dd; ++d) {
          dk[d] += gk[d];
          dv[d] += gv[d];
        }
      }
    });
    // 4. Through the normalisation k = q/||q||: dq += (dk - k (k.dk)) / ||q||.
    for (int64_t i = 0; i < N; ++i) add_normalised_key_grad(a.q.row(b, h, i), dKn + i * Dd, inv[i], Dd, a.dq.row(b, h, i));
  }

  // ---- the centroids' moving average (training) ----
  // Per (batch, head): the sum of the routing vectors nearest each centroid, and their count.
  void accumulate_sums(int64_t b, int64_t h, const float* inv, const AttnArgs& a) const {
    const int64_t Dd = D();
    float* sum = sums_.data() + (b * problem_.shape.H + h) * k_ * Dd;
    int64_t* count = counts_.data() + (b * problem_.shape.H + h) * k_;
    fill(sum, k_ * Dd, 0.0f);
    std::fill(count, count + k_, 0);
    const int64_t* assign = assignment_of(b, h);
    for (int64_t i = 0; i < problem_.shape.N; ++i) {
      float* s = sum + assign[i] * Dd;
      const float* q = a.q.row(b, h, i);
      const float r = inv[i];
#pragma omp simd
      for (int64_t d = 0; d < Dd; ++d) s[d] += r * q[d];
      ++count[assign[i]];
    }
  }
  // After the heads: per head and centroid, the batch's sums added in batch order (the same at
  // any thread count), normalised, and mixed in: mu <- decay·mu + (1 - decay)·m.
  void update_centroids() {
    const auto& s = problem_.shape;
    const int64_t Dd = D();
    float* m = work_floats(0) + layout(mode_).Qt;  // the heads are done: thread 0's tile buffer is free
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t c = 0; c < k_; ++c) {
        int64_t n = 0;
        fill(m, Dd, 0.0f);
        for (int64_t b = 0; b < s.B; ++b) {
          const float* part = sums_.data() + ((b * s.H + h) * k_ + c) * Dd;
          for (int64_t d = 0; d < Dd; ++d) m[d] += part[d];
          n += counts_.data()[(b * s.H + h) * k_ + c];
        }
        const float norm = std::sqrt(dot(m, m, Dd));
        if (n == 0 || !(norm > 0)) continue;
        float* mu = centroids_.data() + (h * k_ + c) * Dd;
        for (int64_t d = 0; d < Dd; ++d) mu[d] = decay_ * mu[d] + (1.0f - decay_) * (m[d] / norm);
      }
  }

  int64_t k_, w_;
  float decay_;
  bool training_ = false;
  Buffer<float> centroids_, lse_, sums_, work_floats_;
  Buffer<int64_t> assignment_, members_, counts_;
  Buffer<int32_t> work_ints_;
};

}  // namespace

MechanismInfo routing_info() {
  MechanismInfo m;
  m.name = "routing";
  m.family = "routing";
  m.summary = "Routing Transformer: shared query-key routed by online k-means; each centroid's top-window tokens attend each other";
  m.complexity = "O(N k D + N window D) time (O(N^1.5 D) at k = sqrt(N)), O(N k + N D) memory";
  m.caps = Capabilities{.exact = false, .causal = true, .backward = true, .decode = false,
                        .constraints = "clusters and window at most N",
                        .attn_dropout = false,
                        .no_attn_dropout = "not implemented: its tiles' softmax has no dropout mask"};
  m.caps.no_additive_bias = "not implemented: the tiles would need each pair's offset through the routing";
  m.params = {ParamSpec{"clusters", ParamType::Int, int64_t{0}, 0, 1 << 20, {}, "k-means centroids per head; 0 means round(sqrt(N))"},
              ParamSpec{"window", ParamType::Int, int64_t{0}, 0, 1 << 20, {},
                        "tokens per cluster (not causal: each centroid's top-window; causal: the last window of the query's cluster); 0 means ceil(N/clusters)"},
              ParamSpec{"decay", ParamType::Float, 0.999, 0.0, 1.0, {}, "training: the centroids' moving-average decay (1 keeps them fixed)"}};
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<Routing>(p, v); };
  // From the routing the forward made (its nearest-centroid assignment and top-window members are
  // held to the dumped centroids apart: near-ties may round differently in float and double).
  m.reference = [](const Attention& impl, const AttnArgs& a, const AttnProblem& p, const ParamValues& v) {
    const DumpTensor assignment = dump_tensor(impl, "assignment"), centroids = dump_tensor(impl, "centroids");
    if (p.causal) {
      const int64_t k = centroids.shape[1];
      const int64_t window = v.get_int("window") > 0 ? v.get_int("window") : (p.shape.N + k - 1) / k;
      return ref::routing(a.q, a.v, assignment.i64, nullptr, k, window, true);
    }
    const DumpTensor members = dump_tensor(impl, "members");
    return ref::routing(a.q, a.v, assignment.i64, members.i64, members.shape[2], members.shape[3], false);
  };
  return m;
}

std::vector<double> ref::routing(const TensorView& q, const TensorView& v, const int64_t* assignment,
                                 const int64_t* members, int64_t clusters, int64_t window, bool causal) {
  const Shape4& s = q.shape;
  const int64_t N = s.N;
  std::vector<double> out(static_cast<size_t>(s.numel()));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const Rows key = shared_keys(q, b, h);
      std::vector<LseCombine> acc(static_cast<size_t>(N), LseCombine(s.D));
      // A query's keys: those of its tile other than itself, itself when there are none.
      auto attend_tile = [&](int64_t i, const std::vector<int64_t>& tile) {
        std::vector<int64_t> keys;
        for (int64_t j : tile)
          if (j != i) keys.push_back(j);
        if (keys.empty()) keys.push_back(i);
        attend_positions(q, v, b, h, i, key, keys, acc[i]);
      };
      if (!causal) {
        // every member of each cluster's tile attends the whole tile
        for (int64_t c = 0; c < clusters; ++c) {
          const int64_t* m = members + ((b * s.H + h) * clusters + c) * window;
          const std::vector<int64_t> tile(m, m + window);
          for (int64_t i : tile) attend_tile(i, tile);
        }
      } else {
        // each position: the last `window` positions up to itself of its own cluster
        const int64_t* assign = assignment + (b * s.H + h) * N;
        for (int64_t i = 0; i < N; ++i) {
          std::vector<int64_t> same;
          for (int64_t j = 0; j <= i; ++j)
            if (assign[j] == assign[i]) same.push_back(j);
          const size_t from = same.size() > size_t(window) ? same.size() - window : 0;
          attend_tile(i, std::vector<int64_t>(same.begin() + from, same.end()));
        }
      }
      for (int64_t i = 0; i < N; ++i) {
        const auto o = acc[i].result();  // zero for a position in no tile
        for (int64_t d = 0; d < s.D; ++d) out[idx(s, b, h, i, d)] = o[d];
      }
    }
  return out;
}

}  // namespace ab
