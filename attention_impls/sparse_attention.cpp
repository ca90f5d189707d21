#include "attention_impls/sparse_attention.hpp"

#include <omp.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>

#include "attention_impls/kv_cache.hpp"
#include "attention_impls/position_bias.hpp"
#include "core/vecmath.hpp"

namespace ab {
TensorView RowSet::of(const TensorView& t) const {
  TensorView v = t;
  v.data = t.data + first * t.strides.sn;
  v.shape.N = n;
  if (fold) {
    v.shape.B = t.shape.B * t.shape.H;
    v.shape.H = fold;
    v.strides = {t.strides.sh, t.strides.sn, step * t.strides.sn};
  } else {
    v.strides.sn = step * t.strides.sn;
  }
  return v;
}

struct SparseAttention::Part {
  Segment seg;
  bool direct = false;  // no earlier segment has these query rows: write O and lse directly
  QKLogits qk;
  BiasedLogits biased;  // qk with the position encoding added (AttnProblem::bias)
  TiledSoftmax engine;
  Buffer<float> kg, vg, dkg, dvg;  // gathered keys and values, and their gradients
  bool gathered() const { return seg.gathered; }
};

SparseAttention::SparseAttention(const AttnProblem& p)
    : problem_(p), bias_(std::make_unique<PositionBias>(p.bias, p.shape, p.causal, 1.0f / std::sqrt(static_cast<float>(p.shape.D)), p.threads)) {
  if (p.bias.active() && p.dtype == Dtype::bf16)
    throw InvalidInput("the sparse patterns add a position encoding in float32 only (no --dtype bf16)");
}

const LogitsSource& SparseAttention::source(const Part& part) const {
  return bias_->active() ? static_cast<const LogitsSource&>(part.biased) : static_cast<const LogitsSource&>(part.qk);
}

std::vector<LearnedTensor> SparseAttention::learned() { return bias_->learned(); }
std::vector<DumpTensor> SparseAttention::dump_tensors() const { return bias_->dump_tensors(); }


SparseAttention::~SparseAttention() = default;

void SparseAttention::build(Rng* rng) const {
  const auto& s = problem_.shape;
  const auto& st = problem_.strides;
  parts_.clear();
  for (Segment& seg : make_segments(rng)) {
    if (seg.queries.n <= 0 || seg.keys.n <= 0) continue;
    if (seg.queries.fold && st.sb != s.H * st.sh)
      throw InvalidInput("strided patterns need Q, K, V with contiguous (batch, head) strides");
    auto part = std::make_unique<Part>();
    const bool gathered = seg.gathered;
    // Row strides of Q, K, V as the engine reads them: the inputs', or (bf16) the copies', in
    // bf16 numbers; the output's always the input's.
    const int64_t sn_in = bf16() ? 2 * bf16_row_floats() : st.sn;
    const int64_t ld_q = seg.queries.step * sn_in;
    const int64_t ld_k = gathered ? (bf16() ? 2 * bf16_row_floats() : s.D) : seg.keys.step * sn_in;
    part->qk = QKLogits(s.D, ld_q, ld_k, 1.0f / std::sqrt(static_cast<float>(s.D)), seg.keys_major, bf16());
    // bf16 backward: the float gradients' strides (the caller's dQ, dK; a gathered part's dK buffer).
    const int64_t ld_dk = gathered ? s.D : seg.keys.step * st.sn;
    if (bf16()) part->qk.set_grad_strides(seg.queries.step * st.sn, ld_dk);
    TiledSoftmaxShape sh;
    sh.B = seg.queries.fold ? s.B * s.H : s.B;
    sh.H = seg.queries.fold ? seg.queries.fold : s.H;
    sh.Nq = seg.queries.n;
    sh.Nk = seg.keys.n;
    sh.D = s.D;
    sh.causal = seg.causal;
    sh.exclude_self = seg.exclude_self;
    sh.heads_inner = seg.queries.fold > 0 && seg.tight;
    sh.ld_v = ld_k;
    sh.ld_o = seg.queries.step * st.sn;
    if (bf16()) {  // backward: dV in float, dO as its bf16 copy
      sh.ld_dv = ld_dk;
      sh.ld_dout = seg.queries.step * sn_in;
    }
    sh.threads = problem_.threads;
    sh.keys = seg.range;
    sh.fwd_rows = seg.tile_rows;
    sh.fwd_cols = seg.tile_cols;
    sh.bwd_rows = seg.bwd_tile_rows > 0 ? seg.bwd_tile_rows : seg.tile_cols;
    sh.bwd_cols = seg.bwd_tile_cols > 0 ? seg.bwd_tile_cols : seg.tile_rows;
    sh.tight = seg.tight;
    sh.diagonal = seg.diagonal && !problem_.attn_dropout;
    sh.bf16_tiles = bf16();
    sh.prefix_keys = seg.prefix_keys;
    // T5's bias sums its gradient per thread: a fixed hand-out of (b, h) keeps the sum's order.
    sh.static_schedule = problem_.bias.kind == PositionBiasKind::t5;
    part->engine = TiledSoftmax(sh);
    part->seg = std::move(seg);
    // Where the engine's rows and keys are in the sequence, for the position encoding.
    const Segment& sg = part->seg;
    TilePositions at;
    at.q_first = sg.queries.first;
    at.q_step = sg.queries.step;
    at.k_first = sg.keys.first;
    at.k_step = sg.keys.step;
    at.fold = sg.queries.fold;
    at.heads = s.H;
    if (sg.gathered) {
      at.gather = sg.gather.data();
      at.gather_n = sg.keys.n;
    }
    part->biased = BiasedLogits(&part->qk, bias_.get(), at);
    parts_.push_back(std::move(part));
  }
  // Which segments come first to all their rows, and whether some row is still new to a
  // segment that resumes, or has no segment at all.
  std::vector<char> seen(static_cast<size_t>(s.N), 0);
  bool zero_first = false;
  for (auto& part : parts_) {
    const RowSet& r = part->seg.queries;
    auto each_row = [&](auto&& f) {
      for (int64_t c = 0; c < std::max<int64_t>(r.fold, 1); ++c)
        for (int64_t t = 0; t < r.n; ++t) f(static_cast<size_t>(r.first + c + t * r.step));
    };
    bool fresh = true, some_new = false;
    each_row([&](size_t i) {
      fresh = fresh && !seen[i];
      some_new = some_new || !seen[i];
    });
    each_row([&](size_t i) { seen[i] = 1; });
    part->direct = fresh;
    zero_first = zero_first || (!fresh && some_new);
  }
  zero_first_ = zero_first || std::count(seen.begin(), seen.end(), 0) > 0;
  built_ = true;
  planned_ = false;
}

// Sums a per-(b, h) count of each part over the parts and their (b, h).
template <typename Count>
double SparseAttention::sum_over_parts(Count count) const {
  if (!built_) build(nullptr);
  double p = 0;
  for (const auto& part : parts_) {
    const auto& sh = part->engine.shape();
    p += count(*part) * static_cast<double>(sh.B * sh.H);
  }
  return p;
}

double SparseAttention::pairs() const {
  return sum_over_parts([](const Part& part) { return part.engine.pairs(); });
}

// A backward-only segment's keys are scored by the band that holds them as prefix keys.
double SparseAttention::scored_pairs() const {
  return sum_over_parts([](const Part& part) { return part.seg.backward_only ? 0.0 : part.engine.scored_pairs(); });
}

double SparseAttention::flops(Mode mode) const {
  if (mode == Mode::decode) {
    const auto [lo, hi] = window_keys(problem_.shape.N);
    return attention_pair_flops(static_cast<double>(hi - lo), problem_.shape.D) * static_cast<double>(problem_.shape.B * problem_.shape.H);
  }
  return with_backward(attention_pair_flops(pairs(), problem_.shape.D), mode);
}

size_t SparseAttention::working_bytes(Mode mode) const {
  if (mode == Mode::decode) {
    const int64_t W = window_capacity();
    return ring_bytes(W) + static_cast<size_t>(problem_.threads * W) * sizeof(float);
  }
  if (!built_) build(nullptr);
  const auto& s = problem_.shape;
  size_t b = 0;
  for (auto& part : parts_) {
    if (!planned_ || planned_mode_ != mode) part->engine.plan(mode, source(*part));
    b += part->engine.working_bytes(mode) + part->qk.working_bytes(problem_.threads);
    if (part->gathered())
      b += (2 * gathered_floats(*part) + (mode == Mode::fwdbwd ? 2 * gathered_grad_floats(*part) : 0)) * sizeof(float) +
           static_cast<size_t>(s.H * part->seg.keys.n) * sizeof(int64_t);
  }
  b += pattern_bytes() + bf16_bytes(mode) + bias_->working_bytes(mode);
  planned_ = true;
  planned_mode_ = mode;
  // The merged log-sum-exp.
  return b + static_cast<size_t>(s.B * s.H * s.N) * sizeof(float);
}

size_t SparseAttention::bf16_bytes(Mode mode) const {
  if (!bf16()) return 0;
  const size_t copies = mode == Mode::fwdbwd ? 4 : 3;  // Q, K, V (and dO)
  return copies * static_cast<size_t>(problem_.shape.B * problem_.shape.H * problem_.shape.N * bf16_row_floats()) * sizeof(float);
}

// A gathered part's gradients of its keys and values: D floats a row in every dtype.
size_t SparseAttention::gathered_grad_floats(const Part& part) const {
  return static_cast<size_t>(problem_.shape.B * problem_.shape.H * part.seg.keys.n * problem_.shape.D);
}

// A gathered part's copy of its keys (or values): D floats a row, or bf16_row_floats in bf16.
size_t SparseAttention::gathered_floats(const Part& part) const {
  const int64_t row = bf16() ? bf16_row_floats() : problem_.shape.D;
  return static_cast<size_t>(problem_.shape.B * problem_.shape.H * part.seg.keys.n * row);
}

size_t SparseAttention::ring_bytes(int64_t W) const {
  return 2 * static_cast<size_t>(problem_.shape.B * problem_.shape.H * W * problem_.shape.D) * sizeof(float);
}

void SparseAttention::setup(Mode mode, Rng& rng) {
  if (mode == Mode::decode) {
    if (bias_->active()) throw InvalidInput("the sparse patterns decode without a position encoding (the model adds it in its forward pass only)");
    const int64_t W = window_capacity();
    const auto& s = problem_.shape;
    ring_k_ = Buffer<float>(static_cast<size_t>(s.B * s.H * W * s.D));
    ring_v_ = Buffer<float>(ring_k_.size());
    ring_scores_ = Buffer<float>(static_cast<size_t>(problem_.threads * W));
    return;
  }
  bias_->setup(mode, rng);  // first: its parameters are then those flash draws from the same seed
  build(&rng);
  const auto& s = problem_.shape;
  for (auto& part : parts_) {
    part->engine.plan(mode, source(*part));
    part->engine.setup(mode);
    part->qk.setup(problem_.threads);
    if (part->gathered()) {
      const size_t n = gathered_floats(*part);
      part->kg = Buffer<float>(n);
      part->vg = Buffer<float>(n);
      if (mode == Mode::fwdbwd) {
        part->dkg = Buffer<float>(gathered_grad_floats(*part));
        part->dvg = Buffer<float>(gathered_grad_floats(*part));
      }
    }
  }
  planned_ = true;
  planned_mode_ = mode;
  lse_ = Buffer<float>(static_cast<size_t>(s.B * s.H * s.N));
  if (bf16()) {
    const size_t n = static_cast<size_t>(s.B * s.H * s.N * bf16_row_floats());
    q_b_ = Buffer<float>(n);
    k_b_ = Buffer<float>(n);
    v_b_ = Buffer<float>(n);
    if (mode == Mode::fwdbwd) do_b_ = Buffer<float>(n);
  }
}

namespace {
TensorView contiguous_view(const Buffer<float>& buf, int64_t B, int64_t H, int64_t N, int64_t D) {
  const Shape4 s{B, H, N, D};
  return TensorView{buf.data(), s, Strides3::contiguous(s)};
}

// Rows 0 .. n - 1 of t.
TensorView rows_of(const TensorView& t, int64_t n) {
  TensorView v = t;
  v.shape.N = n;
  return v;
}
}  // namespace

TensorView SparseAttention::keys_view(const Part& part, const TensorView& t, const Buffer<float>& gathered) const {
  if (part.gathered())
    return contiguous_view(gathered, problem_.shape.B, problem_.shape.H, part.seg.keys.n, bf16() ? bf16_row_floats() : problem_.shape.D);
  return part.seg.keys.of(t);
}

TensorView SparseAttention::grads_view(const Part& part, const TensorView& t, const Buffer<float>& gathered) const {
  if (part.gathered()) return contiguous_view(gathered, problem_.shape.B, problem_.shape.H, part.seg.keys.n, problem_.shape.D);
  return part.seg.keys.of(t);
}

void SparseAttention::set_dropout(const Dropout& d) {
  if (d.active() && !problem_.attn_dropout) throw std::logic_error("set_dropout on a problem not planned for dropout");
  if (!built_) build(nullptr);
  for (size_t i = 0; i < parts_.size(); ++i) parts_[i]->engine.set_dropout(d.with_salt(i));
}

template <class F>
void SparseAttention::for_each_gathered(const Part& part, F&& f) const {
  const auto& s = problem_.shape;
  const int64_t nk = part.seg.keys.n, row = bf16() ? bf16_row_floats() : s.D;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    const int64_t b = bh / s.H, h = bh % s.H;
    for (int64_t u = 0; u < nk; ++u) f(b, h, part.seg.gather[static_cast<size_t>(h * nk + u)], (bh * nk + u) * row);
  }
}

// bf16: Q, K, V rounded into the copies (pass 0 of a bf16 call), each row padded to an even D
// with a zero the products never read. Returns views of the copies, D/2 floats a row.
AttnArgs SparseAttention::round_inputs(const AttnArgs& a) {
  const auto& s = problem_.shape;
  const int64_t row = bf16_row_floats();
  AttnArgs r = a;
  r.q = contiguous_view(q_b_, s.B, s.H, s.N, row);
  r.k = contiguous_view(k_b_, s.B, s.H, s.N, row);
  r.v = contiguous_view(v_b_, s.B, s.H, s.N, row);
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    const int64_t b = bh / s.H, h = bh % s.H;
    for (int64_t i = 0; i < s.N; ++i)
      for (auto [in, out] : {std::pair{&a.q, &r.q}, std::pair{&a.k, &r.k}, std::pair{&a.v, &r.v}}) {
        uint16_t* y = reinterpret_cast<uint16_t*>(out->row(b, h, i));
        to_bf16(in->row(b, h, i), y, s.D);
        if (s.D % 2) y[s.D] = 0;
      }
  }
  return r;
}

// Forward: per segment, its engine computes the softmax over the segment's keys. A segment
// that is first to all its rows writes O and lse; a later one resumes from them, so that O and
// lse become the softmax over the union of the keys so far (segments have disjoint key sets).
void SparseAttention::forward(const AttnArgs& args) {
  const auto& s = problem_.shape;
  const int64_t D = s.D;
  // Q, K, V as the segments read them (bf16: the rounded copies); O is always the caller's.
  const AttnArgs a = bf16() ? round_inputs(args) : args;
  const int64_t row_bytes = bf16() ? bf16_row_floats() * static_cast<int64_t>(sizeof(float)) : D * static_cast<int64_t>(sizeof(float));
  const TensorView lse{lse_.data(), Shape4{s.B, s.H, s.N, 1}, Strides3{s.H * s.N, s.N, 1}};
  // Rows that no earlier segment has when a resuming segment reaches them, and rows no segment
  // has at all, start as O = 0 (no admissible key) and lse = -inf.
  if (zero_first_) {
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
      for (int64_t i = 0; i < s.N; ++i) fill(a.o.row(bh / s.H, bh % s.H, i), D, 0.0f);
      fill(lse_.data() + bh * s.N, s.N, kNegInf);
    }
  }
  bias_->prepare(a.q);
  for (auto& part_ptr : parts_) {
    Part& part = *part_ptr;
    const Segment& seg = part.seg;
    if (seg.backward_only) continue;
    if (part.gathered())
      for_each_gathered(part, [&](int64_t b, int64_t h, int64_t row, int64_t slot) {
        std::memcpy(part.kg.data() + slot, a.k.row(b, h, row), static_cast<size_t>(row_bytes));
        std::memcpy(part.vg.data() + slot, a.v.row(b, h, row), static_cast<size_t>(row_bytes));
      });
    const TensorView l = seg.queries.of(lse);
    const LseView lv{l.data, l.strides.sb, l.strides.sh, l.strides.sn};
    part.qk.bind(seg.queries.of(a.q), keys_view(part, a.k, part.kg));
    // Longformer's global keys held by a band (fuse_prefix_keys): rows 0 .. prefix_keys - 1.
    const TensorView prefix_v = rows_of(a.v, seg.prefix_keys);
    if (seg.prefix_keys > 0) part.qk.bind_prefix(rows_of(a.k, seg.prefix_keys));
    part.engine.forward(source(part), keys_view(part, a.v, part.vg), seg.queries.of(a.o), &lv, !part.direct,
                        seg.prefix_keys > 0 ? &prefix_v : nullptr);
  }
}

// Backward: every segment's engine with the merged lse and output, accumulating into dQ, dK, dV
// (gathered keys through their buffers, scattered back).
void SparseAttention::backward(const AttnArgs& a) {
  const auto& s = problem_.shape;
  const int64_t D = s.D;
  // bf16: the products read the forward's rounded copies of Q, K, V (and the gathered parts'
  // copies of them) and dO rounded here; the gradients stay float.
  AttnArgs r = a;
  if (bf16()) {
    const int64_t row = bf16_row_floats();
    r.q = contiguous_view(q_b_, s.B, s.H, s.N, row);
    r.k = contiguous_view(k_b_, s.B, s.H, s.N, row);
    r.v = contiguous_view(v_b_, s.B, s.H, s.N, row);
    r.dout = contiguous_view(do_b_, s.B, s.H, s.N, row);
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < s.B * s.H; ++bh)
      for (int64_t i = 0; i < s.N; ++i) {
        uint16_t* y = reinterpret_cast<uint16_t*>(r.dout.row(bh / s.H, bh % s.H, i));
        to_bf16(a.dout.row(bh / s.H, bh % s.H, i), y, D);
        if (D % 2) y[D] = 0;
      }
  }
  const TensorView lse{lse_.data(), Shape4{s.B, s.H, s.N, 1}, Strides3{s.H * s.N, s.N, 1}};
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < s.B * s.H; ++bh)
    for (int64_t i = 0; i < s.N; ++i) {
      const int64_t b = bh / s.H, h = bh % s.H;
      fill(a.dq.row(b, h, i), D, 0.0f);
      fill(a.dk.row(b, h, i), D, 0.0f);
      fill(a.dv.row(b, h, i), D, 0.0f);
    }
  bias_->begin_backward();
  for (auto& part : parts_) {
    const Segment& seg = part->seg;
    if (part->gathered()) {
      part->dkg.zero();
      part->dvg.zero();
    }
    const TensorView l = seg.queries.of(lse);
    const LseView lv{l.data, l.strides.sb, l.strides.sh, l.strides.sn};
    part->qk.bind(seg.queries.of(r.q), keys_view(*part, r.k, part->kg));
    part->qk.bind_grads(seg.queries.of(a.dq), grads_view(*part, a.dk, part->dkg), true);
    if (bf16()) part->engine.bind_bf16(keys_view(*part, r.v, part->vg), seg.queries.of(r.dout));
    part->engine.backward(source(*part), keys_view(*part, r.v, part->vg), seg.queries.of(a.o),
                          seg.queries.of(a.dout), grads_view(*part, a.dv, part->dvg), true, &lv);
    if (part->gathered())
      for_each_gathered(*part, [&](int64_t b, int64_t h, int64_t row, int64_t slot) {
        float* dk = a.dk.row(b, h, row);
        float* dv = a.dv.row(b, h, row);
        // `slot` places the key in the copies (bf16: bf16_row_floats a row); its gradient rows are D floats.
        const int64_t at = slot / (bf16() ? bf16_row_floats() : D) * D;
        const float* gk = part->dkg.data() + at;
        const float* gv = part->dvg.data() + at;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) {
          dk[d] += gk[d];
          dv[d] += gv[d];
        }
      });
  }
  if (bias_->active()) bias_->finish_backward(a.q, a.dq, problem_.param_grads);
}

// ---- decode against the window: a ring of the last window_capacity() keys and values ----

void SparseAttention::decode_prefill(const AttnArgs& a, int64_t n) {
  const auto& s = problem_.shape;
  const int64_t W = window_capacity(), D = s.D;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t j = std::max<int64_t>(0, n - W); j < n; ++j) {
        const size_t slot = static_cast<size_t>(((b * s.H + h) * W + j % W) * D);
        std::memcpy(ring_k_.data() + slot, a.k.row(b, h, j), static_cast<size_t>(D) * sizeof(float));
        std::memcpy(ring_v_.data() + slot, a.v.row(b, h, j), static_cast<size_t>(D) * sizeof(float));
      }
}

void SparseAttention::decode_step(const AttnArgs& t, int64_t pos) {
  const auto& s = problem_.shape;
  const int64_t W = window_capacity(), D = s.D;
  const auto [lo, hi] = window_keys(pos);
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < s.B * s.H; ++bh) {
    const int64_t b = bh / s.H, h = bh % s.H;
    float* K = ring_k_.data() + bh * W * D;
    float* V = ring_v_.data() + bh * W * D;
    std::memcpy(K + (pos % W) * D, t.k.head(b, h), static_cast<size_t>(D) * sizeof(float));
    std::memcpy(V + (pos % W) * D, t.v.head(b, h), static_cast<size_t>(D) * sizeof(float));
    float* scores = ring_scores_.data() + static_cast<size_t>(omp_get_thread_num()) * W;
    attend_cached(
        t.q.head(b, h), hi - lo, D, [&](int64_t j) { return K + ((lo + j) % W) * D; },
        [&](int64_t j) { return V + ((lo + j) % W) * D; }, scores, t.o.head(b, h));
  }
}

}  // namespace ab
