// reformer: LSH attention with shared query-key.
// Paper: Kitaev, Kaiser, Levskaya 2020, "Reformer: The Efficient Transformer".
// Complexity: per head and round, O(N·D·n_buckets/2) for the hash projection (with the default
//   n_buckets = N/bucket_size this is O(N²·D/(2·bucket_size)): in 16-bit integers about 8% of
//   the forward call at N = 4096 and 20% at 16384 on an AVX2 Zen 4), O(N + n_buckets) for the
//   sort (a counting sort: positions are already in order, so sorting by (bucket, position) is
//   a stable sort by bucket), O(N·2·bucket_size·D) for the chunk attention. Memory per thread O(N + bucket_size·D) forward, O(N·D) with backward;
//   O(n_hashes·N) for the bucket assignments.
// Computes (mechanisms.md): keys are K_j = Q_j/||Q_j|| (the K input is not used; dK is zero);
//   per round r and head h a rotation R (D, n_buckets/2), standard normal, seeded;
//   bucket(i) = argmax([Q_i·R ; -Q_i·R]) (the same as for the normalised key: a positive scale
//   does not move an argmax); sorted order by (bucket, position) cut into chunks of bucket_size;
//   a query attends the keys of its chunk and the previous one (the last one for chunk 0; with a
//   single chunk, only itself) that share its bucket, never its own position unless it has no
//   other admissible key, and with causal only j <= i. Causal: each bucket's run of the sorted
//   order starts a chunk of its own (the order is padded to bucket_size at every bucket), and
//   chunk 0 has no previous one: a query's keys are then the same-bucket positions of its own
//   and the previous chunk of its bucket, a function of positions <= i alone. With the one cut
//   of the whole order, how many positions of lower buckets came later moved the chunk
//   boundaries, and with them which earlier keys a query saw: its output depended on later
//   positions (CAB's prefix check measured 1e-2), a leak a causal language model trains on.
//   Rounds combine by their log-sum-exp:
//   O_i = Σ_r exp(lse_r,i - L_i)·O_r,i with L_i = logsumexp_r(lse_r,i), accumulated online.
// Optimises: the hash (the one part whose cost grows as N² at the default n_buckets = N/64) is
//   exact and runs in 16-bit integers: rows and rotations are quantised, multiplied with AVX2
//   multiply-adds, and only rows whose top two projections lie within the proven error bound
//   (about 1%) are recomputed in double (lsh_hash.hpp); each chunk gathers its
//   normalised keys and V (prefetching the random rows ahead) into a window buffer that holds
//   the previous chunk in front, so the window of 2·bucket_size keys is one contiguous tile in
//   cache and its logits and output are two oneDNN products; the output rows the chunk will
//   merge into are prefetched before its products, and the next chunk's key and value rows
//   into L2 during its softmax; (batch, head) pairs run in parallel.
// Backward: the combined output is one softmax over the union of every round's admissible keys
//   with normaliser L_i, so each round recomputes its chunk logits and applies the flash-style
//   backward with the global L_i and delta_i = dO_i·O_i; gradients of the keys flow into dQ
//   through the normalisation. Hashing and sorting are piecewise constant: no gradient.
// Training: fresh rotations every step (redraw=step, the default, as the paper trains), or the
//   first draw kept (redraw=never).
// Leaves out: the paper's duplicate-attention correction across rounds (mechanisms.md combines
//   rounds by log-sum-exp only), reversible layers and chunked feed-forward (model-level
//   features), and running rounds of one head on different threads: rounds are combined online
//   into one output buffer, which keeps memory at O(N·D) instead of O(n_hashes·N·D).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "attention_impls/lsh_hash.hpp"
#include "attention_impls/per_head_attention.hpp"
#include "attention_impls/position_bias.hpp"
#include "attention_impls/registry.hpp"
#include "attention_impls/shared_qk.hpp"
#include "core/matmul.hpp"
#include "core/vecmath.hpp"  // and <immintrin.h> on AVX2 + FMA and AVX-512 builds

namespace ab {
namespace {

// Rows a gather asks for ahead of the one it copies: enough to cover a miss to L3 at the rate
// rows are copied.
constexpr int64_t kGatherAhead = 16;

// The number of buckets the spec defaults to: N / bucket_size rounded up to an even number, at
// least 2.
int64_t default_buckets(int64_t N, int64_t bucket_size) {
  const int64_t q = std::max<int64_t>(1, N / std::max<int64_t>(1, bucket_size));
  return std::max<int64_t>(2, (q + 1) / 2 * 2);
}

class Reformer final : public PerHeadAttention {
 public:
  Reformer(const AttnProblem& p, const ParamValues& v)
      : PerHeadAttention(p),
        bucket_size_(v.get_int("bucket_size")),
        n_hashes_(v.get_int("n_hashes")),
        n_buckets_(v.get_int("n_buckets") > 0 ? v.get_int("n_buckets") : default_buckets(p.shape.N, v.get_int("bucket_size"))),
        nchunks_(p.shape.N / std::max<int64_t>(1, v.get_int("bucket_size"))),
        redraw_each_step_(v.get_choice("redraw") == "step"),
        bias_(p.bias, p.shape, p.causal, 1.0f / std::sqrt(static_cast<float>(p.shape.D)), p.threads) {}

  // A position encoding (AttnProblem::bias) is added to each chunk's logits from the sorted
  // order's original positions (the permutation), so a pair's bias is that of its true offset.
  void forward(const AttnArgs& a) override {
    bias_.prepare(a.q);
    PerHeadAttention::forward(a);
  }
  void backward(const AttnArgs& a) override {
    bias_.begin_backward();
    PerHeadAttention::backward(a);
    if (bias_.active()) bias_.finish_backward(a.q, a.dq, problem_.param_grads);
  }
  std::vector<LearnedTensor> learned() override { return bias_.learned(); }

  // Training: fresh rotations every step (as the Reformer paper trains), unless redraw=never.
  void begin_train_step(int64_t, Rng& rng) override {
    if (!redraw_each_step_) return;
    rng.fill_normal(rotations_.data(), static_cast<int64_t>(rotations_.size()));
    for (auto& hash : hashes_) hash.repack();
  }

  void validate() const override {
    if (problem_.shape.N % bucket_size_ != 0)
      throw InvalidInput("reformer: N=" + std::to_string(problem_.shape.N) + " is not a multiple of bucket_size=" +
                         std::to_string(bucket_size_));
    if (n_buckets_ % 2 != 0 || n_buckets_ < 2)
      throw InvalidInput("reformer: n_buckets=" + std::to_string(n_buckets_) +
                         " must be even and at least 2 (the hash is argmax over [xR ; -xR], R has n_buckets/2 columns)");
    if (problem_.shape.D > 65536)
      throw InvalidInput("reformer: D=" + std::to_string(problem_.shape.D) +
                         " is above 65536, the largest head dimension its exact int16 hash scales for");
  }

  double flops(Mode mode) const override {
    const auto& s = problem_.shape;
    const double N = static_cast<double>(s.N), D = static_cast<double>(s.D);
    const double hash = 2.0 * N * D * static_cast<double>(n_buckets_ / 2);
    const double attention = attention_pair_flops(N * static_cast<double>(window()), s.D);
    const double per_round = hash + (mode == Mode::fwd ? attention : 3.5 * attention);
    return per_round * static_cast<double>(n_hashes_ * s.B * s.H);
  }

  size_t working_bytes(Mode mode) const override {
    plan(mode);
    const Layout L = layout(mode);
    return persistent_bytes() +
           static_cast<size_t>(problem_.threads) * (L.floats * sizeof(float) + L.ints * sizeof(int32_t)) + scratchpad_bytes() +
           bias_.working_bytes(mode);
  }

  void setup(Mode mode, Rng& rng) override {
    plan(mode);  // the layout below depends on the products' scratchpads
    bias_.setup(mode, rng);  // first: its table is then the one flash draws from the same seed
    const auto& s = problem_.shape;
    rotations_ = Buffer<float>(static_cast<size_t>(n_hashes_ * s.H * s.D * (n_buckets_ / 2)));
    rng.fill_normal(rotations_.data(), static_cast<int64_t>(rotations_.size()));
    const int64_t half = n_buckets_ / 2;
    hashes_.clear();
    for (int64_t h = 0; h < s.H; ++h) hashes_.emplace_back(rotations_.data() + h * s.D * half, s.H * s.D * half, n_hashes_, s.D, half);
    buckets_ = Buffer<int64_t>(static_cast<size_t>(s.B * s.H * n_hashes_ * s.N));
    lse_ = Buffer<float>(static_cast<size_t>(s.B * s.H * s.N));
    const Layout L = layout(mode);
    work_floats_ = Buffer<float>(static_cast<size_t>(problem_.threads) * L.floats);
    work_ints_ = Buffer<int32_t>(static_cast<size_t>(problem_.threads) * L.ints);
    bind_products(mode);
  }

  std::vector<DumpTensor> dump_tensors() const override {
    const auto& s = problem_.shape;
    std::vector<DumpTensor> t = {DumpTensor{"rotations", {n_hashes_, s.H, s.D, n_buckets_ / 2}, rotations_.data(), nullptr},
                                 DumpTensor{"buckets", {s.B, s.H, n_hashes_, s.N}, nullptr, buckets_.data()}};
    for (const DumpTensor& e : bias_.dump_tensors()) t.push_back(e);
    return t;
  }
  std::string dump_note() const override {
    return "shared query-key: the keys are Q_j/||Q_j||; the K input is not used and dk is zero";
  }

 private:
  // Keys each query's window holds: its chunk and the previous one, or only its own chunk when
  // the sequence is one chunk (the previous chunk would be the same keys again).
  int64_t window() const { return single() ? bucket_size_ : 2 * bucket_size_; }
  bool single() const { return nchunks_ == 1; }
  // Rows of the sorted arrays: the previous chunk of chunk 0 in front (the last chunk, or with
  // causal padding), then N, and with causal the padding that starts each bucket on a chunk: at
  // most bucket_size - 1 rows for each of at most min(n_buckets, N) buckets.
  int64_t padded() const {
    return problem_.shape.N + bucket_size_ + (problem_.causal ? std::min(n_buckets_, problem_.shape.N) * bucket_size_ : 0);
  }

  // Per-thread workspace (floats and int32), each array aligned to 16 elements.
  struct Layout {
    size_t inv = 0, Ks = 0, Vs = 0, S = 0, Oc = 0, M = 0, Z = 0, lc = 0;  // forward
    size_t Qs = 0, dOs = 0, dKs = 0, dVs = 0, dKn = 0, dA = 0, Ls = 0, deltas = 0, delta = 0;  // backward
    size_t perm = 0, bsort = 0, count = 0, hash = 0, run_lo = 0, run_hi = 0;                                         // int32
    size_t floats = 0, ints = 0;
  };
  Layout layout(Mode mode) const {
    Layout L;
    const size_t N = static_cast<size_t>(problem_.shape.N), D = static_cast<size_t>(problem_.shape.D),
                 P = static_cast<size_t>(padded()), b = static_cast<size_t>(bucket_size_), W = static_cast<size_t>(window());
    size_t at = 0;
    auto take = [&at](size_t n) {
      const size_t o = at;
      at += (n + 15) / 16 * 16;
      return o;
    };
    L.inv = take(N);
    // Both passes keep two windows (each the previous chunk, then the current one) of the sorted
    // keys and values.
    L.Ks = take(4 * b * D);
    L.Vs = take(4 * b * D);
    L.S = take(b * W);
    L.Oc = take(b * D);
    L.M = take(N);
    L.Z = take(N);
    L.lc = take(2 * b);  // per chunk row: this round's lse, then 1/sum
    if (mode == Mode::fwdbwd) {
      L.Qs = take(b * D);   // the chunk's queries
      L.dOs = take(b * D);  // and their upstream gradient
      L.dKs = take(W * D);  // the window's gradients
      L.dVs = take(W * D);
      L.dKn = take(N * D);  // gradient of the normalised keys, by position, over every round
      L.dA = take(b * W);
      L.Ls = take(b);
      L.deltas = take(b);
      L.delta = take(N);
    }
    L.floats = at;
    at = 0;
    L.perm = take(P);
    L.bsort = take(P);
    L.count = take(static_cast<size_t>(n_buckets_) + 1);
    L.hash = take(RotationHash::scratch_bytes(problem_.shape.D, n_buckets_ / 2) / sizeof(int32_t));
    L.run_lo = take(W);
    L.run_hi = take(W);
    L.ints = at;
    return L;
  }
  size_t persistent_bytes() const {
    const auto& s = problem_.shape;
    return static_cast<size_t>(n_hashes_ * s.H * s.D * (n_buckets_ / 2)) * sizeof(float)           // rotations
           + static_cast<size_t>(s.H) * RotationHash::packed_bytes(n_hashes_, s.D, n_buckets_ / 2)  // quantised
           + static_cast<size_t>(s.B * s.H * n_hashes_ * s.N) * sizeof(int64_t)     // buckets
           + static_cast<size_t>(s.B * s.H * s.N) * sizeof(float);            // L, for backward
  }

  // ---- matrix product shapes (row-major; see MatmulSpec::tile) ----
  int64_t D() const { return problem_.shape.D; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(problem_.shape.D)); }
  // S(bs, W) = scale · Qs(bs, D) Ks(W, D)^T
  MatmulSpec spec_qk() const { return MatmulSpec::tile(bucket_size_, window(), D(), D(), false, D(), true, window(), scale()); }
  // Oc(bs, D) = A(bs, W) Vs(W, D)
  MatmulSpec spec_av() const { return MatmulSpec::tile(bucket_size_, D(), window(), window(), false, D(), false, D()); }
  // dA(bs, W) = dOs(bs, D) Vs(W, D)^T
  MatmulSpec spec_dav() const { return MatmulSpec::tile(bucket_size_, window(), D(), D(), false, D(), true, window()); }
  // dQc(bs, D) = scale · dS(bs, W) Ks(W, D)   (into Oc)
  MatmulSpec spec_dq() const { return MatmulSpec::tile(bucket_size_, D(), window(), window(), false, D(), false, D(), scale()); }
  // dKs(W, D) += scale · dS^T(W, bs) Qs(bs, D)
  MatmulSpec spec_dk() const {
    return MatmulSpec::tile(window(), D(), bucket_size_, window(), true, D(), false, D(), scale(), true);
  }
  // dVs(W, D) += A^T(W, bs) dOs(bs, D)
  MatmulSpec spec_dv() const { return MatmulSpec::tile(window(), D(), bucket_size_, window(), true, D(), false, D(), 1.0f, true); }

  std::vector<MatmulSpec> products(Mode mode) const override {
    std::vector<MatmulSpec> p = {spec_qk(), spec_av()};
    if (mode == Mode::fwdbwd) p.insert(p.end(), {spec_dav(), spec_dq(), spec_dk(), spec_dv()});
    return p;
  }

  float* work_floats(int tid) const { return work_floats_.data() + static_cast<size_t>(tid) * layout(mode_).floats; }
  int32_t* work_ints(int tid) const { return work_ints_.data() + static_cast<size_t>(tid) * layout(mode_).ints; }
  int64_t* buckets_of(int64_t b, int64_t h, int64_t r) const {
    return buckets_.data() + ((b * problem_.shape.H + h) * n_hashes_ + r) * problem_.shape.N;
  }

  // 1/||Q_i|| for every row (a zero row keeps a zero key instead of NaN).
  void inverse_norms(const AttnArgs& a, int64_t b, int64_t h, float* inv) const {
    ab::inverse_norms(a.q.row(b, h, 0), problem_.strides.sn, problem_.shape.N, D(), inv);
  }

  // Bucket of every position in every round: argmax over [x·R ; -x·R], first index on ties,
  // exactly (lsh_hash.hpp); inv from inverse_norms.
  void hash(const AttnArgs& a, int tid, int64_t b, int64_t h, const float* inv) const {
    hashes_[static_cast<size_t>(h)].assign(a.q.row(b, h, 0), problem_.strides.sn, problem_.shape.N, inv,
                                           work_ints(tid) + layout(mode_).hash, buckets_of(b, h, 0), problem_.shape.N);
  }

  // Round r's sorted order: perm[bs + p] is the position at sorted index p, perm[0, bs) the
  // previous chunk of chunk 0; bsort likewise holds the buckets. A stable counting sort by
  // bucket, since positions are visited in increasing order. Not causal: one cut of the N
  // sorted rows, and chunk 0's previous chunk is the last one (the wrap). Causal: each bucket's
  // run starts on a chunk boundary, the rows between runs and in front are padding (bucket -1:
  // no query attends them; position 0, so gathers read a real row; their own outputs and
  // gradients are dropped). Returns the number of chunks.
  int64_t sort_round(const int64_t* bucket, int32_t* perm, int32_t* bsort, int32_t* count) const {
    const int64_t N = problem_.shape.N, C = bucket_size_;
    std::fill(count, count + n_buckets_ + 1, 0);
    for (int64_t i = 0; i < N; ++i) ++count[bucket[i] + 1];
    if (problem_.causal)  // each run rounded up to whole chunks
      for (int64_t k = 1; k <= n_buckets_; ++k) count[k] = (count[k] + C - 1) / C * C;
    for (int64_t k = 0; k < n_buckets_; ++k) count[k + 1] += count[k];
    const int64_t rows = count[n_buckets_];  // N, or N and the padding
    if (problem_.causal) {
      std::fill(perm, perm + C + rows, 0);
      std::fill(bsort, bsort + C + rows, -1);
    }
    for (int64_t i = 0; i < N; ++i) {
      const int32_t at = count[bucket[i]]++;
      perm[bucket_size_ + at] = static_cast<int32_t>(i);
      bsort[bucket_size_ + at] = static_cast<int32_t>(bucket[i]);
    }
    if (!problem_.causal) {
      std::memcpy(perm, perm + N, static_cast<size_t>(bucket_size_) * sizeof(int32_t));
      std::memcpy(bsort, bsort + N, static_cast<size_t>(bucket_size_) * sizeof(int32_t));
    }
    return rows / C;
  }

  // Rows of a (B, H, N, D) tensor in sorted order: dst[p] = scale_p · src[perm[p]] for p < rows,
  // written to dst2 as well when given.
  void gather(const TensorView& t, int64_t b, int64_t h, const int32_t* perm, int64_t rows, float* dst,
              const float* row_scale = nullptr, float* dst2 = nullptr) const {
    const int64_t Dd = D();
    for (int64_t p = 0; p < rows; ++p) {
      if (p + kGatherAhead < rows) prefetch(t.row(b, h, perm[p + kGatherAhead]), Dd);
      const float* src = t.row(b, h, perm[p]);
      float* d = dst + p * Dd;
      const float s = row_scale ? row_scale[perm[p]] : 1.0f;
      if (dst2) {
        float* d2 = dst2 + p * Dd;
#pragma omp simd
        for (int64_t c = 0; c < Dd; ++c) d[c] = d2[c] = s * src[c];
        continue;
      }
#pragma omp simd
      for (int64_t c = 0; c < Dd; ++c) d[c] = s * src[c];
    }
  }

  // Masks the chunk's logits S (bs x W): keys of another bucket, later keys when causal, and the
  // query's own position unless no other key is admissible. Window column k holds padded sorted
  // index w0 + k; the chunk's query row rr is padded index q0 + rr.
  //
  // Except for chunk 0's wrapped window, a window is a contiguous piece of the order sorted by
  // (bucket, position): a query's same-bucket keys are one run of columns [lo, hi), in position
  // order, so its causal keys are [lo, self]. Those rows are masked by two fills; the wrapped
  // window is checked key by key. (Causal padding rows form runs of their own bucket, -1.)
  void mask_chunk(float* S, int64_t q0, int64_t w0, const int32_t* perm, const int32_t* bsort, int32_t* run_lo,
                  int32_t* run_hi) const {
    const int64_t W = window();
    const int32_t* pk = perm + w0;
    const int32_t* bk = bsort + w0;
    const bool wrapped = !single() && w0 == 0 && !problem_.causal;
    if (!wrapped) {
      for (int64_t k = 0; k < W; ++k) run_lo[k] = k > 0 && bk[k] == bk[k - 1] ? run_lo[k - 1] : static_cast<int32_t>(k);
      for (int64_t k = W - 1; k >= 0; --k) run_hi[k] = k + 1 < W && bk[k] == bk[k + 1] ? run_hi[k + 1] : static_cast<int32_t>(k + 1);
    }
    for (int64_t rr = 0; rr < bucket_size_; ++rr) {
      float* row = S + rr * W;
      const int64_t self = q0 + rr - w0;  // the query's own column
      if (!wrapped) {
        const int64_t lo = run_lo[self], hi = problem_.causal ? self + 1 : run_hi[self];
        fill(row, lo, kNegInf);
        fill(row + hi, W - hi, kNegInf);
        if (hi - lo > 1) row[self] = kNegInf;
        continue;
      }
      const int32_t iq = pk[self], bq = bk[self];
      const float own = row[self];
      bool any = false;
      for (int64_t k = 0; k < W; ++k) {
        const bool ok = bk[k] == bq && pk[k] != iq && (!problem_.causal || pk[k] <= iq);
        row[k] = ok ? row[k] : kNegInf;
        any |= ok;
      }
      if (!any) row[self] = own;
    }
  }

  // Window start (padded sorted index) of chunk c.
  int64_t window_start(int64_t c) const { return single() ? bucket_size_ + c * bucket_size_ : c * bucket_size_; }

  // The normalised keys and the values of each chunk's window live in two alternating buffers
  // Kw, Vw of two windows each: [previous chunk ; chunk]. Both passes walk the chunks in order.
  struct Window {
    const float *K, *V;  // the window: 2·bs rows, or the chunk's bs with a single chunk
    const float* Kcur;   // the chunk's own normalised keys (the window's second half)
  };
  // Before chunk 0: the wrapped previous chunk (the last one, padded sorted rows [0, bs)).
  void load_first_previous(const AttnArgs& a, int64_t b, int64_t h, const int32_t* perm, const float* inv,
                           float* Kw, float* Vw) const {
    if (single()) return;
    gather(a.q, b, h, perm, bucket_size_, Kw, inv);
    gather(a.v, b, h, perm, bucket_size_, Vw);
  }
  // Gathers chunk c just before use, so the products read it from cache: into its window's
  // second half, and also into the other buffer's first half, as the next chunk's previous one.
  Window load_window(const AttnArgs& a, int64_t b, int64_t h, const int32_t* perm, const float* inv, float* Kw,
                     float* Vw, int64_t c, int64_t nch) const {
    const int64_t slot = bucket_size_ * D(), q0 = bucket_size_ + c * bucket_size_;
    const int64_t here = (c % 2) * 2 * slot, next = ((c + 1) % 2) * 2 * slot;
    float *Kcur = Kw + here + slot, *Vcur = Vw + here + slot;
    const bool pass_on = !single() && c + 1 < nch;
    gather(a.q, b, h, perm + q0, bucket_size_, Kcur, inv, pass_on ? Kw + next : nullptr);
    gather(a.v, b, h, perm + q0, bucket_size_, Vcur, nullptr, pass_on ? Vw + next : nullptr);
    if (single()) return Window{Kcur, Vcur, Kcur};
    return Window{Kw + here, Vw + here, Kcur};
  }

  void forward_head(const AttnArgs& a, int tid, int64_t b, int64_t h) const override {
    const Layout L = layout(mode_);
    float* w = work_floats(tid);
    int32_t* wi = work_ints(tid);
    float *inv = w + L.inv, *Kw = w + L.Ks, *Vw = w + L.Vs, *S = w + L.S, *Oc = w + L.Oc;
    float *M = w + L.M, *Z = w + L.Z, *lc = w + L.lc;
    int32_t *perm = wi + L.perm, *bsort = wi + L.bsort;
    const int64_t N = problem_.shape.N, Dd = D(), W = window();
    // 1. Norms of the shared keys; 2. buckets of every round.
    inverse_norms(a, b, h, inv);
    hash(a, tid, b, h, inv);
    for (int64_t r = 0; r < n_hashes_; ++r) {
      // 3. Sort. The previous chunk of chunk 0 is the last chunk (padded sorted rows [0, bs)).
      const int64_t nch = sort_round(buckets_of(b, h, r), perm, bsort, wi + L.count);
      load_first_previous(a, b, h, perm, inv, Kw, Vw);
      // 4. Each chunk: its window of normalised keys and V (load_window). Queries are not gathered:
      //    q_i·k_j = ||q_i||·(k_i·k_j), so a chunk's queries are its own key rows, and each logit
      //    row is scaled by ||q_i|| inside the softmax. Then logits over the window, mask,
      //    unnormalised softmax (its sum goes into the merge weight), output.
      for (int64_t c = 0; c < nch; ++c) {
        const int64_t q0 = bucket_size_ + c * bucket_size_, w0 = window_start(c);
        const Window win = load_window(a, b, h, perm, inv, Kw, Vw, c, nch);
        // The merge below updates the chunk's output rows in random order: ask for them now.
        for (int64_t rr = 0; rr < bucket_size_; ++rr) prefetch(a.o.row(b, h, perm[q0 + rr]), Dd, true);
        mm_.run(tid, spec_qk(), win.Kcur, win.K, S);
        mask_chunk(S, q0, w0, perm, bsort, wi + L.run_lo, wi + L.run_hi);
        for (int64_t rr = 0; rr < bucket_size_; ++rr) {
          float* Sr = S + rr * W;
          // The next chunk's key and value rows are random rows of Q and V, missing L2 once N·D
          // outgrows it: ask for one pair per softmax row, so the misses overlap this chunk's
          // arithmetic instead of stalling the next gather (all of them at once would fill the
          // miss queue and stall here instead). Likewise the output rows its merge will update.
          if (c + 1 < nch) {
            prefetch_l2(a.q.row(b, h, perm[q0 + bucket_size_ + rr]), Dd);
            prefetch_l2(a.v.row(b, h, perm[q0 + bucket_size_ + rr]), Dd);
            prefetch_l2(a.o.row(b, h, perm[q0 + bucket_size_ + rr]), Dd);
          }
          // ||q_i||; a zero query has a zero key, its finite logits are 0 at any positive scale.
          const float nq = std::max(inv[perm[q0 + rr]] > 0.0f ? 1.0f / inv[perm[q0 + rr]] : 0.0f,
                                    std::numeric_limits<float>::min());
          scale_inplace(Sr, W, nq);
          if (bias_.active() && bsort[q0 + rr] >= 0)  // masked keys stay -inf; padding keys are masked
            bias_.add_row(b, h, perm[q0 + rr], KeyPositions{0, 1, nullptr, perm + w0}, W, Sr);
          const float m = max_of(Sr, W);
          const float sum = exp_shift_sum(Sr, Sr, W, m);
          lc[rr] = m + std::log(sum);
          lc[bucket_size_ + rr] = 1.0f / sum;
        }
        mm_.run(tid, spec_av(), S, win.V, Oc);
        // 5. Merge into O online: O_i holds Σ_r exp(lse_r - M_i)·O_r,i, Z_i the sum of the
        //    weights, M_i the largest lse so far.
        for (int64_t rr = 0; rr < bucket_size_; ++rr) {
          if (bsort[q0 + rr] < 0) continue;  // causal padding
          const int32_t i = perm[q0 + rr];
          float* o = a.o.row(b, h, i);
          const float* oc = Oc + rr * Dd;
          const float norm = lc[bucket_size_ + rr];
          if (r == 0) {
#pragma omp simd
            for (int64_t d = 0; d < Dd; ++d) o[d] = norm * oc[d];
            M[i] = lc[rr];
            Z[i] = 1.0f;
            continue;
          }
          merge_by_lse(o, oc, Dd, lc[rr], norm, M[i], Z[i]);
        }
      }
    }
    // 6. Normalise, and keep L_i = logsumexp_r(lse_r,i) for the backward pass.
    float* lse = lse_.data() + (b * problem_.shape.H + h) * N;
    for (int64_t i = 0; i < N; ++i) {
      scale_inplace(a.o.row(b, h, i), Dd, 1.0f / Z[i]);
      lse[i] = M[i] + std::log(Z[i]);
    }
  }

  // ---- backward ----
  // Streams the sorted order chunk by chunk like the forward pass: the working set per thread is
  // two windows plus one chunk's queries and upstream gradient, not whole sorted copies (at N =
  // 16384 those were 24 MiB per head and pushed the inputs out of L3).
  void backward_head(const AttnArgs& a, int tid, int64_t b, int64_t h) const override {
    const Layout L = layout(mode_);
    float* w = work_floats(tid);
    int32_t* wi = work_ints(tid);
    float *inv = w + L.inv, *Kw = w + L.Ks, *Vw = w + L.Vs, *A = w + L.S, *dQc = w + L.Oc;
    float *Qc = w + L.Qs, *dOc = w + L.dOs, *dKw = w + L.dKs, *dVw = w + L.dVs, *dKn = w + L.dKn, *dA = w + L.dA;
    float *Lc = w + L.Ls, *dc = w + L.deltas, *delta = w + L.delta;
    int32_t *perm = wi + L.perm, *bsort = wi + L.bsort;
    const int64_t N = problem_.shape.N, Dd = D(), W = window(), slot = bucket_size_ * Dd;
    const float* lse = lse_.data() + (b * problem_.shape.H + h) * N;
    inverse_norms(a, b, h, inv);
    for (int64_t i = 0; i < N; ++i) {
      delta[i] = dot(a.dout.row(b, h, i), a.o.row(b, h, i), Dd);
      fill(a.dq.row(b, h, i), Dd, 0.0f);
      fill(a.dk.row(b, h, i), Dd, 0.0f);  // K is not an input of the mechanism
      fill(a.dv.row(b, h, i), Dd, 0.0f);
    }
    fill(dKn, N * Dd, 0.0f);
    // Adds rows [0, bs) of the window gradients to the positions pos[0, bs) (padding rows, of
    // bucket -1, have none).
    auto scatter = [&](const int32_t* pos, const int32_t* bucket) {
      for (int64_t p = 0; p < bucket_size_; ++p) {
        if (bucket[p] < 0) continue;
        float* dk = dKn + static_cast<int64_t>(pos[p]) * Dd;
        float* dv = a.dv.row(b, h, pos[p]);
        const float *gk = dKw + p * Dd, *gv = dVw + p * Dd;
#pragma omp simd
        for (int64_t d = 0; d < Dd; ++d) {
          dk[d] += gk[d];
          dv[d] += gv[d];
        }
      }
    };
    for (int64_t r = 0; r < n_hashes_; ++r) {
      // 1. The round's sorted order, and the first window's previous chunk (as forward).
      const int64_t nch = sort_round(buckets_of(b, h, r), perm, bsort, wi + L.count);
      load_first_previous(a, b, h, perm, inv, Kw, Vw);
      fill(dKw, W * Dd, 0.0f);
      fill(dVw, W * Dd, 0.0f);
      for (int64_t c = 0; c < nch; ++c) {
        const int64_t q0 = bucket_size_ + c * bucket_size_, w0 = window_start(c);
        // 2. The chunk's window of keys and values, its queries, dO, L and delta.
        const Window win = load_window(a, b, h, perm, inv, Kw, Vw, c, nch);
        gather(a.q, b, h, perm + q0, bucket_size_, Qc);
        gather(a.dout, b, h, perm + q0, bucket_size_, dOc);
        for (int64_t rr = 0; rr < bucket_size_; ++rr) {
          Lc[rr] = lse[perm[q0 + rr]];
          dc[rr] = delta[perm[q0 + rr]];
        }
        // 3. A = exp(S - L) (the combined softmax's share of this round), dS = A (dA - delta),
        //    then dQ of the chunk and dK~, dV of the window.
        mm_.run(tid, spec_qk(), Qc, win.K, A);
        mask_chunk(A, q0, w0, perm, bsort, wi + L.run_lo, wi + L.run_hi);
        mm_.run(tid, spec_dav(), dOc, win.V, dA);
        for (int64_t rr = 0; rr < bucket_size_; ++rr) {
          // The next chunk's rows, into L2 while this chunk computes (see forward_head).
          if (c + 1 < nch) {
            const int32_t i = perm[q0 + bucket_size_ + rr];
            prefetch_l2(a.q.row(b, h, i), Dd);
            prefetch_l2(a.v.row(b, h, i), Dd);
            prefetch_l2(a.dout.row(b, h, i), Dd);
          }
          // This chunk's dQ rows and the rows its scatter will add to.
          prefetch_l2(a.dq.row(b, h, perm[q0 + rr]), Dd);
          if (!single()) {
            prefetch_l2(dKn + static_cast<int64_t>(perm[w0 + rr]) * Dd, Dd);
            prefetch_l2(a.dv.row(b, h, perm[w0 + rr]), Dd);
          }
          float* Ar = A + rr * W;
          float* dAr = dA + rr * W;
          const bool biased = bias_.active() && bsort[q0 + rr] >= 0;
          const KeyPositions keys{0, 1, nullptr, perm + w0};
          if (biased) bias_.add_row(b, h, perm[q0 + rr], keys, W, Ar);
          exp_shift_sum(Ar, Ar, W, Lc[rr]);
          const float dl = dc[rr];
#pragma omp simd
          for (int64_t k = 0; k < W; ++k) dAr[k] = Ar[k] * (dAr[k] - dl);
          if (biased) bias_.accumulate_row(tid, b, h, perm[q0 + rr], keys, W, dAr);
        }
        mm_.run(tid, spec_dq(), dA, win.K, dQc);
        mm_.run(tid, spec_dk(), dA, Qc, dKw);
        mm_.run(tid, spec_dv(), A, dOc, dVw);
        for (int64_t rr = 0; rr < bucket_size_; ++rr) {
          if (bsort[q0 + rr] < 0) continue;  // causal padding
          float* dq = a.dq.row(b, h, perm[q0 + rr]);
          const float* g = dQc + rr * Dd;
#pragma omp simd
          for (int64_t d = 0; d < Dd; ++d) dq[d] += g[d];
        }
        // 4. The window's first chunk has had both its own chunk and the next one: its
        //    gradients are complete (for chunk 0, those of the wrapped last chunk's keys as
        //    chunk 0's previous chunk). Scatter them, and carry the second half over as the
        //    next window's first.
        if (!single()) {
          scatter(perm + w0, bsort + w0);
          std::memcpy(dKw, dKw + slot, static_cast<size_t>(slot) * sizeof(float));
          std::memcpy(dVw, dVw + slot, static_cast<size_t>(slot) * sizeof(float));
          fill(dKw + slot, slot, 0.0f);
          fill(dVw + slot, slot, 0.0f);
        } else if (c + 1 < nch) {  // one chunk of keys per window (causal padding made more chunks)
          scatter(perm + q0, bsort + q0);
          fill(dKw, W * Dd, 0.0f);
          fill(dVw, W * Dd, 0.0f);
        }
      }
      // The last chunk's own contributions (the whole window with a single chunk).
      scatter(perm + nch * bucket_size_, bsort + nch * bucket_size_);
    }
    // 5. Through the normalisation k = q/||q||: dq += (dk - k (k·dk)) / ||q||.
    for (int64_t i = 0; i < N; ++i) add_normalised_key_grad(a.q.row(b, h, i), dKn + i * Dd, inv[i], Dd, a.dq.row(b, h, i));
  }

  int64_t bucket_size_, n_hashes_, n_buckets_, nchunks_;
  bool redraw_each_step_;
  mutable PositionBias bias_;  // backward_head (const) sums into its accumulators
  Buffer<float> rotations_, lse_, work_floats_;
  std::vector<RotationHash> hashes_;  // per head: its rounds' rotations, quantised
  Buffer<int64_t> buckets_;
  Buffer<int32_t> work_ints_;
};

}  // namespace

MechanismInfo reformer_info() {
  MechanismInfo m;
  m.name = "reformer";
  m.family = "routing";
  m.summary = "LSH attention: shared query-key hashed by random rotations, sorted into chunks attending themselves and the previous chunk";
  m.complexity = "O(n_hashes N (bucket_size + n_buckets/2) D) time, O(N D) memory";
  m.caps = Capabilities{.exact = false, .causal = true, .backward = true, .decode = false,
                        .constraints = "N a multiple of bucket_size; n_buckets even", .attn_dropout = false, .no_attn_dropout = "not implemented: its chunked softmax over hash rounds has no dropout mask"};
  m.params = {ParamSpec{"bucket_size", ParamType::Int, int64_t{64}, 1, 1 << 20, {}, "chunk length of the sorted order (N must be a multiple)"},
              ParamSpec{"n_buckets", ParamType::Int, int64_t{0}, 0, 1 << 20, {}, "hash buckets, even; 0 means N/bucket_size rounded up to even, at least 2"},
              ParamSpec{"n_hashes", ParamType::Int, int64_t{4}, 1, 64, {}, "hashing rounds, combined by their log-sum-exp"},
              ParamSpec{"redraw", ParamType::Choice, std::string("step"), 0, 0, {"step", "never"},
                        "training: draw fresh rotations every step (the paper's training) or keep the first"}};
  m.caps.additive_bias = true;  // from each key's original position through the sort
  m.caps.no_additive_bias = "";
  m.make = [](const AttnProblem& p, const ParamValues& v) { return std::make_unique<Reformer>(p, v); };
  // From the buckets the forward hashed into (their hash is held to ref::reformer_bucket apart:
  // near-ties may round differently in float and double).
  m.reference = [](const Attention& impl, const AttnArgs& a, const AttnProblem& p, const ParamValues& v) {
    const DumpTensor buckets = dump_tensor(impl, "buckets");
    return ref::reformer(a.q, a.v, buckets.i64, buckets.shape[2], v.get_int("bucket_size"), p.causal);
  };
  return m;
}

int64_t ref::reformer_bucket(const float* x, const float* R, int64_t D, int64_t half) {
  std::vector<double> p(static_cast<size_t>(2 * half));
  for (int64_t c = 0; c < half; ++c) {
    double dot = 0;
    for (int64_t k = 0; k < D; ++k) dot += double(x[k]) * double(R[k * half + c]);
    p[c] = dot;
    p[half + c] = -dot;
  }
  return std::max_element(p.begin(), p.end()) - p.begin();
}

std::vector<double> ref::reformer(const TensorView& q, const TensorView& v, const int64_t* buckets, int64_t rounds,
                                  int64_t bucket_size, bool causal) {
  const Shape4& s = q.shape;
  const int64_t N = s.N, nchunks = N / bucket_size;
  std::vector<double> out(static_cast<size_t>(s.numel()));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const Rows key = shared_keys(q, b, h);
      std::vector<LseCombine> acc(static_cast<size_t>(N), LseCombine(s.D));
      for (int64_t rd = 0; rd < rounds; ++rd) {
        const int64_t* bucket = buckets + ((b * s.H + h) * rounds + rd) * N;
        // 1. the sorted order, and each position's rank within its bucket
        std::vector<int64_t> order(static_cast<size_t>(N)), rank(static_cast<size_t>(N), 0);
        for (int64_t i = 0; i < N; ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return bucket[x] < bucket[y]; });
        for (int64_t i = 0; i < N; ++i)
          for (int64_t j = 0; j < i; ++j) rank[i] += bucket[j] == bucket[i];
        // 2. each query's admissible keys in this round, and its softmax over them
        for (int64_t p = 0; p < N; ++p) {
          const int64_t i = order[p], c = p / bucket_size;
          std::set<int64_t> window;
          if (causal) {
            const int64_t ci = rank[i] / bucket_size;
            for (int64_t j = 0; j <= i; ++j)
              if (bucket[j] == bucket[i] && (rank[j] / bucket_size == ci || (nchunks > 1 && rank[j] / bucket_size == ci - 1)))
                window.insert(j);
          } else {
            for (int64_t cc : {c, (c + nchunks - 1) % nchunks})
              for (int64_t t = cc * bucket_size; t < (cc + 1) * bucket_size; ++t) window.insert(order[t]);
          }
          std::vector<int64_t> keys;
          for (int64_t j : window)
            if (bucket[j] == bucket[i] && j != i && (!causal || j <= i)) keys.push_back(j);
          if (keys.empty()) keys.push_back(i);
          attend_positions(q, v, b, h, i, key, keys, acc[i]);
        }
      }
      // 3. the rounds combined by their log-sum-exp
      for (int64_t i = 0; i < N; ++i) {
        const auto o = acc[i].result();
        for (int64_t d = 0; d < s.D; ++d) out[idx(s, b, h, i, d)] = o[d];
      }
    }
  return out;
}

}  // namespace ab
