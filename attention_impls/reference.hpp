// The plain formulas the kernels are held to, in double precision. Softmax attention under a mask
// (below, defined in reference.cpp) is the oracle of every exact mechanism, whose file states the
// pairs it computes (MechanismInfo::reference_mask). Every other mechanism's formula is declared
// at the end and defined in that mechanism's own file, beside its kernel (MechanismInfo::reference
// binds it to a running mechanism's drawn or learned state). Plain loops, slow and obvious on
// purpose, llm.c style; the tests call them, the suite never times them.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace ab::ref {

// allowed(i, j): may query i use key j. Rows without an admissible key give zero output.
using Mask = std::function<bool(int64_t, int64_t)>;
Mask dense_mask(bool causal);
// `pattern`, and with causal also j <= i.
Mask causal_and(Mask pattern, bool causal);

struct Grads {
  std::vector<double> dq, dk, dv;  // (B, H, N, D) each, row-major
};

// Index of (b, h, n, d) in a row-major (B, H, N, D) tensor.
inline size_t idx(const Shape4& s, int64_t b, int64_t h, int64_t n, int64_t d) {
  return static_cast<size_t>(((b * s.H + h) * s.N + n) * s.D + d);
}

// P (N, N) of head (b, h): softmax_j(q_i . k_j / sqrt(D)) over the allowed keys, 0 elsewhere.
std::vector<double> probs(const TensorView& q, const TensorView& k, int64_t b, int64_t h, const Mask& allowed);
// O (B, H, N, D) = P V, every head.
std::vector<double> forward(const TensorView& q, const TensorView& k, const TensorView& v, const Mask& allowed);
// Analytic gradients of L = sum(dout * O): dV = P^T dO, dP = dO V^T,
// dS = P (dP - rowsum(dP P)) / sqrt(D), dQ = dS K, dK = dS^T Q.
Grads backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout, const Mask& allowed);
// sum(dout * forward(q, k, v)).
double loss(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout, const Mask& allowed);

// ---- building blocks of the formulas below (reference.cpp) ----
// Rows of D doubles.
using Rows = std::vector<std::vector<double>>;
// One head (b, h) of softmax(Q keys^T / sqrt(D)) values, over explicit keys and values (T, D):
// (N, D) row-major.
std::vector<double> attend(const TensorView& q, int64_t b, int64_t h, const Rows& keys, const Rows& values);
// Writes one head's (N, D) rows into a (B, H, N, D) output.
void put_head(std::vector<double>& out, const Shape4& s, int64_t b, int64_t h, const std::vector<double>& head);
// RoFormer's rotation of a feature row at position n: pair p turns by n * 10000^(-2p/F).
std::vector<double> rotated(const std::vector<double>& x, int64_t n);
// Query i's output of the kernel form: sum_j w_j v_j / (sum_j w_j + 1e-6) over the keys j of
// `fk` (feature rows, key j at position j of head (b, h) of v), w_j = fq . fk_j; rope: the
// numerator's w_j from fq rotated to i and fk_j to j (RoFormer's eq. 19). (D) doubles.
std::vector<double> feature_ratio(const std::vector<double>& fq, int64_t i, const Rows& fk, const TensorView& v,
                                  int64_t b, int64_t h, bool rope);
// The combination of a query's softmax pieces by their log-sum-exp, as the routing mechanisms'
// rounds and tiles are combined: add(lse, o) folds one piece in, result() is sum_r w_r o_r with
// w_r = exp(lse_r) / sum exp(lse), or zeros when no piece came.
struct LseCombine {
  explicit LseCombine(int64_t D) : o(static_cast<size_t>(D), 0.0) {}
  void add(double lse, const std::vector<double>& piece);
  std::vector<double> result() const;
  double m = -1e300, z = 0;
  std::vector<double> o;
};
// Shared query-key (the Reformer, the Routing Transformer): the keys Q_j / ||Q_j|| of head
// (b, h), (N, D).
Rows shared_keys(const TensorView& q, int64_t b, int64_t h);
// Query i's softmax over the key rows key[j] of the positions j in `keys`, scale 1/sqrt(D), with
// their values from v: folded into acc as one piece.
void attend_positions(const TensorView& q, const TensorView& v, int64_t b, int64_t h, int64_t i, const Rows& key,
                      const std::vector<int64_t>& keys, LseCombine& acc);

// ---- the other mechanisms' formulas, each defined in its mechanism's file ----
// Inputs (B, H, N, D); the mechanism's state as its dump writes it, shapes stated; the result O
// (B, H, N, D). Without a position encoding (the sparse tests check those separately).

// bigbird.cpp: the (query, key) pairs of head h, from the drawn random blocks (H, nb, random):
// the global blocks (first ceil(g/2), last floor(g/2)) attend and are attended by all, the window
// of window_blocks blocks centred on the query's, the drawn ones.
Mask bigbird_mask(const int64_t* drawn, int64_t h, int64_t nb, int64_t block, int64_t window_blocks,
                  int64_t global_blocks, int64_t random_blocks);

// linear.cpp: O_i = sum_j (phi(q_i) . phi(k_j)) v_j / (sum_j phi(q_i) . phi(k_j) + 1e-6), j <= i
// when causal, phi = elu + 1; rope: RoFormer's eq. 19 (the numerator's weight from rotated
// feature rows, the normaliser's unrotated).
std::vector<double> linear_attention(const TensorView& q, const TensorView& k, const TensorView& v, bool causal,
                                     bool rope);

// performer.cpp: FAVOR+ with omega (m, D): phi(x) = m^-1/2 exp(omega x' - |x'|^2 / 2), x' = x D^-1/4,
// queries stabilised per row, keys by their maximum over features and the keys a query may see;
// then linear_attention's quadratic form with these features.
std::vector<double> performer(const TensorView& q, const TensorView& k, const TensorView& v, bool causal,
                              const float* omega, int64_t m, bool rope);

// linformer.cpp: K' = E_h K, V' = F_h V (E, F (H, rank, N)), O = softmax(Q K'^T / sqrt(D)) V'.
std::vector<double> linformer(const TensorView& q, const TensorView& k, const TensorView& v, const float* E,
                              const float* F, int64_t rank);

// memory_compressed.cpp: K'_t = sum_r K_{t stride + r} Wk[h, r] (Wk, Wv (H, stride, D, D), the
// last window zero-padded), likewise V'; O = softmax(Q K'^T / sqrt(D)) V'.
std::vector<double> memory_compressed(const TensorView& q, const TensorView& k, const TensorView& v, const float* Wk,
                                      const float* Wv, int64_t stride);

// synthesizer.cpp: O = softmax(A_bh + causal mask) V with the logits A (N, N) of each head given
// by `logits(b, h)`, one function per variant: dense relu(q W1 + b1) W2 + b2 (W1 (H, D, D),
// b1 (H, D), W2 (H, D, L), b2 (H, L), the first N columns), random R (H, N, N), factorized
// R1 R2^T (R1, R2 (H, N, rank)).
std::vector<double> synthesizer(const TensorView& v, bool causal,
                                const std::function<std::vector<double>(int64_t b, int64_t h)>& logits);
std::vector<double> synthesizer_dense_logits(const TensorView& q, int64_t b, int64_t h, const float* W1,
                                             const float* b1, const float* W2, const float* b2, int64_t L);
std::vector<double> synthesizer_factorized_logits(int64_t h, int64_t N, const float* R1, const float* R2,
                                                  int64_t rank);

// sinkhorn.cpp: the sorting matrix P (nb, nb) of head (b, h): block summaries x_c = the mean of
// block c's query rows, logits R = relu(x W1_h) W2_h (W1 (H, D, D), W2 (H, D, nb)), `iters`
// rounds of row then column normalisation of R / temperature in log space, P = exp.
std::vector<double> sinkhorn_sort(const TensorView& q, int64_t b, int64_t h, const float* W1, const float* W2,
                                  int64_t block, int64_t iters, double temperature);
// Then block i's sorted keys and values K~_i = sum_c P_ic K_c, V~_i likewise (blocks of `block`
// rows); each query of block i attends softmax over [K_i ; K~_i] with values [V_i ; V~_i]. Not
// causal.
std::vector<double> sinkhorn(const TensorView& q, const TensorView& k, const TensorView& v, const float* W1,
                             const float* W2, int64_t block, int64_t iters, double temperature);

// reformer.cpp: a row's bucket in one hashing round: argmax over [x R ; -x R] (R (D, half)), the
// first index on ties.
int64_t reformer_bucket(const float* x, const float* R, int64_t D, int64_t half);
// Then shared query-key (keys Q_j / ||Q_j||) over each round's buckets (B, H, rounds, N): sort by
// (bucket, position), chunks of bucket_size, a query attends its bucket's keys in its chunk and
// the previous one (wrapping), itself only when nothing else is admissible; causal: j <= i, the
// chunks cut within each bucket, no wrap. Rounds combined by their log-sum-exp.
std::vector<double> reformer(const TensorView& q, const TensorView& v, const int64_t* buckets, int64_t rounds,
                             int64_t bucket_size, bool causal);

// routing.cpp: shared query-key (keys Q_j / ||Q_j||); not causal, the members (B, H, k, window)
// of each cluster attend each other; causal, each position attends the last `window` positions up
// to itself of its assigned cluster (assignment (B, H, N)). A query skips itself unless it has no
// other key; a position's tiles combine by their log-sum-exp; a position in no tile outputs 0.
std::vector<double> routing(const TensorView& q, const TensorView& v, const int64_t* assignment,
                            const int64_t* members, int64_t clusters, int64_t window, bool causal);

// softmax_conv.cpp (lightconv, dynamicconv): O_i = sum_t w_{i,t} V_{i - pad + t}, pad = K - 1 when
// causal, else (K - 1) / 2, zeros outside the sequence; softmax_conv takes each head's (N, K)
// kernels w. lightconv: w_i = softmax(theta_h) at every i (theta (H, K)); dynamicconv: w_i =
// softmax(q_i W_h + b_h) (W (H, D, K), b (H, K)).
std::vector<double> softmax_conv(const TensorView& v, int64_t K, bool causal,
                                 const std::function<std::vector<double>(int64_t b, int64_t h)>& kernels);
std::vector<double> lightconv(const TensorView& v, const float* theta, int64_t K, bool causal);
std::vector<double> dynamicconv(const TensorView& q, const TensorView& v, const float* W, const float* bias, int64_t K,
                                bool causal);

}  // namespace ab::ref
