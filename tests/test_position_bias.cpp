// The additive position encodings inside the kernels (attention_impls/position_bias.hpp): each
// mechanism that admits them against a float64 reference that adds the same encoding, written
// from its definition, to the materialised logits under the pattern's mask, forward and every
// gradient (inputs and the encoding's own table); T5's buckets and ALiBi's slopes at chosen
// values; the refusals.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "attention_impls/position_bias.hpp"
#include "attention_impls/registry.hpp"
#include "bench/engine/runner.hpp"
#include "tests/helpers.hpp"
#include "tests/patterns.hpp"
#include "tests/reference.hpp"

namespace ab {
namespace {

TEST(T5Buckets, MatchTheDefinitionAtChosenOffsets) {
  // Bidirectional, 32 buckets, max distance 128: 16 per sign, 8 exact, then log-spaced to 128.
  // offset = key - query; T5 counts n = query - key, the future (n < 0) in buckets 16 ...
  const std::vector<std::pair<int64_t, int64_t>> bidirectional = {
      {0, 0}, {-3, 3}, {-7, 7}, {-8, 8}, {-16, 10}, {-20, 10}, {-127, 15}, {-60, 13}, {-128, 15}, {-1000, 15},
      {3, 19}, {8, 24}, {16, 26}, {1000, 31}};
  for (auto [o, want] : bidirectional) EXPECT_EQ(t5_bucket(o, true, 32, 128), want) << "offset " << o;
  // Causal: 16 exact, the future in bucket 0; log(32/16)/log(128/16) * 16 = 5.33 past 16.
  const std::vector<std::pair<int64_t, int64_t>> causal = {{0, 0}, {5, 0}, {-15, 15}, {-16, 16}, {-32, 21}, {-128, 31}, {-5000, 31}};
  for (auto [o, want] : causal) EXPECT_EQ(t5_bucket(o, false, 32, 128), want) << "offset " << o;
}

TEST(AlibiSlopes, GeometricPerHeadAsInThePaper) {
  const auto s8 = alibi_slopes(8);
  for (int h = 0; h < 8; ++h) EXPECT_FLOAT_EQ(s8[h], std::ldexp(1.0f, -(h + 1)));
  // 6 heads: the 4 of a power of two (2^-2 ... 2^-8), then every other one of 8 (2^-1, 2^-3).
  const std::vector<float> want6 = {0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f};
  EXPECT_EQ(alibi_slopes(6), want6);
  EXPECT_FLOAT_EQ(alibi_slopes(1)[0], 1.0f / 256);
}

PositionBiasSpec spec_of(PositionBiasKind k) {
  PositionBiasSpec s;
  s.kind = k;
  s.buckets = 8;  // small, so that N = 80 reaches the log-spaced buckets and the last one
  s.max_distance = 20;
  s.clip = 3;
  return s;
}

// The encoding of pair (i, j) of head h from its definition; shaw needs the query row.
struct ReferenceBias {
  PositionBiasSpec spec;
  bool causal = false;
  int64_t H = 1, D = 1;
  const float* table = nullptr;  // t5: (H, buckets); shaw: (2 clip + 1, D)
  double logit(const TensorView& q, int64_t b, int64_t h, int64_t i, int64_t j) const {
    const double s = 1.0 / std::sqrt(static_cast<double>(D));
    switch (spec.kind) {
      case PositionBiasKind::alibi: return -double(alibi_slopes(H)[h]) * std::abs(double(i - j));
      case PositionBiasKind::t5: return table[h * spec.buckets + t5_bucket(j - i, !causal, spec.buckets, spec.max_distance)];
      case PositionBiasKind::shaw: {
        const int64_t r = std::clamp<int64_t>(j - i, -spec.clip, spec.clip) + spec.clip;
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += double(q.at(b, h, i, d)) * table[r * D + d];
        return s * acc;
      }
      default: return 0;
    }
  }
};

struct ReferenceResult {
  std::vector<double> o, dq, dk, dv, dtable;
};

// allowed(h, i, j): may query i of head h use key j (BigBird's mask differs per head).
using HeadMask = std::function<bool(int64_t, int64_t, int64_t)>;

// Softmax attention with the encoding added to every admissible logit, and the gradients of
// L = sum(dO * O), in double.
ReferenceResult reference(const AttnArgs& a, const HeadMask& allowed, const ReferenceBias& e, size_t table_size) {
  const auto& s = a.q.shape;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  ReferenceResult r;
  const auto n = static_cast<size_t>(s.numel());
  r.o.assign(n, 0.0);
  r.dq = r.dk = r.dv = r.o;
  r.dtable.assign(table_size, 0.0);
  const int64_t N = s.N, D = s.D;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < N; ++i) {
        std::vector<double> P(static_cast<size_t>(N), 0.0);
        double mx = -INFINITY;
        for (int64_t j = 0; j < N; ++j) {
          if (!allowed(h, i, j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double(a.q.at(b, h, i, d)) * a.k.at(b, h, j, d);
          P[j] = dot * scale + e.logit(a.q, b, h, i, j);
          mx = std::max(mx, P[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < N; ++j)
          if (allowed(h, i, j)) sum += (P[j] = std::exp(P[j] - mx));
        for (int64_t j = 0; j < N; ++j) P[j] = allowed(h, i, j) ? P[j] / sum : 0.0;
        std::vector<double> dP(static_cast<size_t>(N), 0.0);
        double rowdot = 0;
        for (int64_t j = 0; j < N; ++j) {
          if (P[j] == 0) continue;
          for (int64_t d = 0; d < D; ++d) {
            r.o[ref::idx(s, b, h, i, d)] += P[j] * a.v.at(b, h, j, d);
            dP[j] += double(a.dout.at(b, h, i, d)) * a.v.at(b, h, j, d);
          }
          rowdot += P[j] * dP[j];
        }
        for (int64_t j = 0; j < N; ++j) {
          if (P[j] == 0) continue;
          const double dS = P[j] * (dP[j] - rowdot);  // dL / dlogit
          for (int64_t d = 0; d < D; ++d) {
            r.dv[ref::idx(s, b, h, j, d)] += P[j] * a.dout.at(b, h, i, d);
            r.dq[ref::idx(s, b, h, i, d)] += dS * scale * a.k.at(b, h, j, d);
            r.dk[ref::idx(s, b, h, j, d)] += dS * scale * a.q.at(b, h, i, d);
          }
          if (e.spec.kind == PositionBiasKind::t5) {
            r.dtable[static_cast<size_t>(h * e.spec.buckets + t5_bucket(j - i, !e.causal, e.spec.buckets, e.spec.max_distance))] += dS;
          } else if (e.spec.kind == PositionBiasKind::shaw) {
            const int64_t rr = std::clamp<int64_t>(j - i, -e.spec.clip, e.spec.clip) + e.spec.clip;
            for (int64_t d = 0; d < D; ++d) {
              r.dq[ref::idx(s, b, h, i, d)] += dS * scale * e.table[rr * D + d];
              r.dtable[static_cast<size_t>(rr * D + d)] += dS * scale * a.q.at(b, h, i, d);
            }
          }
        }
      }
  return r;
}

struct BiasCase {
  std::string mech;
  std::vector<std::string> params;
  bool causal;
};
void PrintTo(const BiasCase& c, std::ostream* os) { *os << c.mech << " " << fmt::format("{}", fmt::join(c.params, " ")) << (c.causal ? " causal" : ""); }

// Runs `c` with encoding `kind` (forward, backward with the table's gradient) on `threads`
// threads and compares with the reference under the pattern's mask (mask_of: given the set-up
// mechanism, for BigBird's drawn blocks).
void check_against_reference(const BiasCase& c, PositionBiasKind kind, const Shape4& s, int threads,
                             const std::function<HeadMask(Attention&)>& mask_of) {
  SCOPED_TRACE(fmt::format("{} {} {}{} threads={}", c.mech, to_string(spec_of(kind)), fmt::join(c.params, " "),
                           c.causal ? " causal" : "", threads));
  omp_set_num_threads(threads);
  const auto& info = find_mechanism(c.mech);
  AttnProblem p{s, c.causal, Strides3::contiguous(s), threads};
  p.bias = spec_of(kind);
  p.param_grads = true;
  auto impl = info.make(p, resolve_params(info, c.params));
  impl->validate();
  const size_t declared = impl->working_bytes(Mode::fwdbwd);
  AttnData data(s, 11, true);
  const size_t base = MemoryMeter::current();
  MemoryMeter::reset_peak();
  Rng rng(11, kStreamParams);
  impl->setup(Mode::fwdbwd, rng);
  const AttnArgs a = data.args();
  impl->forward(a);
  impl->backward(a);
  EXPECT_EQ(MemoryMeter::peak() - base, declared) << "tracked bytes equal the declared working memory";
  auto learned = impl->learned();
  const bool has_table = kind == PositionBiasKind::t5 || kind == PositionBiasKind::shaw;
  ASSERT_EQ(learned.size(), has_table ? 1u : 0u);
  const ReferenceBias e{spec_of(kind), c.causal, s.H, s.D, has_table ? learned[0].value : nullptr};
  const size_t table_size = has_table ? static_cast<size_t>(learned[0].count) : 0;
  const ReferenceResult want = reference(a, mask_of(*impl), e, table_size);
  EXPECT_LT(ref::rel_err(a.o.data, want.o), 2e-5) << "O";
  EXPECT_LT(ref::rel_err(a.dq.data, want.dq), 5e-5) << "dQ";
  EXPECT_LT(ref::rel_err(a.dk.data, want.dk), 5e-5) << "dK";
  EXPECT_LT(ref::rel_err(a.dv.data, want.dv), 5e-5) << "dV";
  if (has_table) {
    EXPECT_LT(ref::rel_err(learned[0].grad, want.dtable), 5e-5) << "the table's gradient";
    // The table's gradient is not trivially zero (the check would pass on a missing backward).
    EXPECT_GT(ref::max_abs(want.dtable), 1e-3);
  }
}

HeadMask dense_or_pattern(const BiasCase& c, int64_t N) {
  if (c.mech == "flash" || c.mech == "vanilla") {
    const auto m = ref::dense_mask(c.causal);
    return [m](int64_t, int64_t i, int64_t j) { return m(i, j); };
  }
  const auto m = test::pattern_mask(c.mech, c.params, N, c.causal);
  return [m](int64_t, int64_t i, int64_t j) { return m(i, j); };
}

class BiasInsideKernels : public ::testing::TestWithParam<BiasCase> {};

// N = 80 crosses tile and block edges; two heads with their own slopes and bias rows.
TEST_P(BiasInsideKernels, EqualsTheMaskedReferenceWithTheSameBias) {
  const BiasCase& c = GetParam();
  const Shape4 s{2, 2, 80, 16};
  for (PositionBiasKind kind : {PositionBiasKind::alibi, PositionBiasKind::t5, PositionBiasKind::shaw})
    check_against_reference(c, kind, s, 1, [&](Attention&) { return dense_or_pattern(c, s.N); });
}

INSTANTIATE_TEST_SUITE_P(
    Mechanisms, BiasInsideKernels,
    ::testing::Values(BiasCase{"flash", {}, false}, BiasCase{"flash", {}, true}, BiasCase{"vanilla", {}, false},
                      BiasCase{"vanilla", {}, true}, BiasCase{"local", {"block=16"}, false},
                      BiasCase{"local", {"block=16"}, true}, BiasCase{"sliding", {"window=9"}, false},
                      BiasCase{"sliding", {"window=9"}, true}, BiasCase{"dilated", {"window=4", "dilation=3"}, false},
                      BiasCase{"dilated", {"window=4", "dilation=3"}, true},
                      BiasCase{"strided", {"stride=8", "summary=2"}, true},
                      BiasCase{"strided", {"stride=8", "summary=2", "pattern=fixed"}, false},
                      BiasCase{"longformer", {"window=6", "global=4"}, false},
                      BiasCase{"longformer", {"window=3", "dilation=2", "global=5"}, false}));

// Two threads: T5's per-thread sums and the sparse segments' static hand-out of pairs.
TEST(BiasInsideKernels, TwoThreadsEqualTheReference) {
  const Shape4 s{3, 2, 80, 16};  // 6 pairs: the threads share them
  for (const BiasCase& c : {BiasCase{"flash", {}, true}, BiasCase{"strided", {"stride=8", "summary=2"}, true},
                            BiasCase{"vanilla", {}, false}})
    for (PositionBiasKind kind : {PositionBiasKind::t5, PositionBiasKind::shaw})
      check_against_reference(c, kind, s, 2, [&](Attention&) { return dense_or_pattern(c, s.N); });
}

// BigBird's keys are gathered (its random blocks): the encoding follows each key's position.
TEST(BiasInsideKernels, BigBirdGatheredKeysUseTheirPositions) {
  const Shape4 s{1, 2, 96, 16};
  const BiasCase c{"bigbird", {"block=8", "global_blocks=2", "random_blocks=2"}, false};
  for (PositionBiasKind kind : {PositionBiasKind::alibi, PositionBiasKind::t5, PositionBiasKind::shaw})
    check_against_reference(c, kind, s, 1, [&](Attention& impl) -> HeadMask {
      const int64_t* drawn = nullptr;
      for (const auto& t : impl.dump_tensors())
        if (t.name == "random_blocks") drawn = t.i64;
      EXPECT_NE(drawn, nullptr);
      return [=](int64_t h, int64_t i, int64_t j) { return ref::bigbird_mask(drawn, h, s.N / 8, 8, 3, 2, 2)(i, j); };
    });
}

// Reformer adds the encoding from each key's original position through its sort (its forward
// against NumPy with the same bias is in check_dump.py): the table's gradient against central
// differences of its own forward (moving the table moves no bucket).
TEST(BiasInsideKernels, ReformerTableGradientMatchesFiniteDifferences) {
  for (PositionBiasKind kind : {PositionBiasKind::t5, PositionBiasKind::shaw})
    for (bool causal : {false, true}) {
      SCOPED_TRACE(fmt::format("{}{}", to_string(spec_of(kind)), causal ? " causal" : ""));
      const Shape4 s{1, 2, 32, 8};
      omp_set_num_threads(1);
      const auto& info = find_mechanism("reformer");
      AttnProblem p{s, causal, Strides3::contiguous(s), 1};
      p.bias = spec_of(kind);
      p.param_grads = true;
      auto impl = info.make(p, resolve_params(info, {"bucket_size=8", "n_buckets=4", "n_hashes=2", "redraw=never"}));
      impl->validate();
      AttnData data(s, 3, true);
      Rng rng(3, kStreamParams);
      impl->setup(Mode::fwdbwd, rng);
      const AttnArgs a = data.args();
      impl->forward(a);
      impl->backward(a);
      auto t = impl->learned().at(0);
      const std::vector<float> grad(t.grad, t.grad + t.count);
      auto loss = [&] {
        impl->forward(a);
        double l = 0;
        for (int64_t i = 0; i < s.numel(); ++i) l += double(a.o.data[i]) * a.dout.data[i];
        return l;
      };
      double largest = 0;
      for (int64_t i = 0; i < t.count; ++i) {
        const float saved = t.value[i];
        t.value[i] = saved + 1e-2f;
        const double lp = loss();
        t.value[i] = saved - 1e-2f;
        const double lm = loss();
        t.value[i] = saved;
        const double fd = (lp - lm) / 2e-2;
        EXPECT_NEAR(grad[static_cast<size_t>(i)], fd, 2e-3 + 2e-2 * std::abs(fd)) << "table element " << i;
        largest = std::max(largest, std::abs(fd));
      }
      EXPECT_GT(largest, 1e-3);  // the encoding reaches the output
    }
}

// The mechanisms that refuse an additive encoding say why, and `train` exits 2 naming both.
TEST(BiasRefusals, UndefinedCombinationsExitTwoNamingMechanismAndEncoding) {
  for (const char* m : {"linear", "performer", "linformer", "memory_compressed", "synthesizer"}) {
    const auto& info = find_mechanism(m);
    EXPECT_FALSE(info.caps.additive_bias) << m;
    EXPECT_FALSE(info.caps.no_additive_bias.empty()) << m;
  }
  const auto r = test::exec("train --attn linear --task copy --seq 32 --layers 1 --dmodel 16 --heads 2 --batch 2 --steps 1 "
                            "--positions alibi --out " + test::temp_path("refused.json"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--positions alibi with linear"), std::string::npos) << r.out;
  const auto bad = test::exec("train --attn flash --task copy --seq 32 --positions bias:7x --out " + test::temp_path("bad.json"));
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("bucket count"), std::string::npos) << bad.out;
  // In a grid of timed points (run, sweep) such a point is SKIPPED with the reason, at either level.
  for (const char* level : {"attention", "model --task listops --batch 2"}) {
    const auto grid = test::exec(fmt::format("run --level {} --attn flash,linear --seq 64 --positions alibi --mode fwd --reps 1 --min-time 0", level));
    EXPECT_EQ(grid.code, 0) << grid.out;
    EXPECT_NE(grid.out.find("SKIPPED: --positions alibi with linear"), std::string::npos) << grid.out;
  }
  // `list` says which encodings each mechanism takes.
  const auto list = test::exec("list mechanisms --wide");
  for (const auto& line : test::lines_of(list.out)) {
    auto row = [&](const char* mech) { return line.rfind(fmt::format("| {} |", mech), 0) == 0; };
    if (row("flash") || row("bigbird") || row("reformer")) {
      EXPECT_NE(line.find("| all |"), std::string::npos) << line;
    }
    if (row("linear") || row("performer")) {  // RoPE inside, on the feature maps; no additive encoding
      EXPECT_NE(line.find("| rope |"), std::string::npos) << line;
    }
    if (row("synthesizer")) {
      EXPECT_NE(line.find("| emb |"), std::string::npos) << line;
    }
    if (row("sinkhorn")) {
      EXPECT_NE(line.find("| rope |"), std::string::npos) << line;
    }
  }

  // At the attention level, the encodings that live outside the mechanism are refused: the
  // embedding's (exit 2); RoPE's rotation of q and k ahead of a mechanism is SKIPPED with the
  // reason, and timed inside the kernel family.
  const auto model_only = test::exec("run --attn flash --seq 64 --positions learned");
  EXPECT_EQ(model_only.code, 2) << model_only.out;
  EXPECT_NE(model_only.out.find("belongs to a model"), std::string::npos) << model_only.out;
  const auto rope = test::exec("run --attn flash,linear --seq 64 --positions rope --mode fwd --reps 1 --min-time 0");
  EXPECT_EQ(rope.code, 0) << rope.out;
  EXPECT_NE(rope.out.find("SKIPPED: --positions rope with flash: RoPE rotates its queries and keys ahead of it"),
            std::string::npos) << rope.out;
  EXPECT_NE(rope.out.find("attn:linear/chunk:64/level:attention/mode:fwd/task:none/B:1/H:8/N:64/D:64/causal:0/threads:1/positions:rope "),
            std::string::npos) << rope.out;
}

}  // namespace
}  // namespace ab
