// What the shared query-key mechanisms (reformer, routing) have in common: a query's partial
// softmaxes (hash rounds, clusters) combined online by their log-sum-exp into one softmax over the
// union of their keys, and the gradient through the keys' normalisation k_j = q_j / ||q_j||.
#pragma once
#include <algorithm>
#include <cstdint>

#include "core/vecmath.hpp"

namespace ab {

// Adds a partial output oc, weighted by `scale`, from a softmax whose log-sum-exp is `lse`, into o,
// the running combination: M is the largest log-sum-exp so far and Z the sum of the partials'
// weights relative to it. o <- keep·o + add·scale·oc with keep = exp(M - M'), add = exp(lse - M');
// at the end o / Z is the combined output and M + log Z its log-sum-exp.
inline void merge_by_lse(float* o, const float* oc, int64_t D, float lse, float scale, float& M, float& Z) {
  const float m = std::max(M, lse);
  const float keep = exp_f32(M - m), add = exp_f32(lse - m);
  const float w = add * scale;
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) o[d] = keep * o[d] + w * oc[d];
  Z = keep * Z + add;
  M = m;
}

// dq += (dk - k (k·dk)) / ||q||, k = q·inv and inv = 1/||q||: the gradient dk of a normalised key
// carried back to the query row it was made from.
inline void add_normalised_key_grad(const float* q, const float* dk, float inv, int64_t D, float* dq) {
  const float kg = inv * dot(q, dk, D);
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) dq[d] += inv * (dk[d] - inv * q[d] * kg);
}

}  // namespace ab
