// The shared core of `linformer` and `memory_compressed`: softmax attention of the N queries
// over Nk keys and values made from K and V by a per-head linear map along the sequence
// (Linformer's projection E, F; the strided convolution). A mechanism supplies the map, its
// transpose for the backward pass and its parameters; the reduced buffers, the tiled engine
// (over Nk keys) and the wiring are here.
#pragma once
#include "attention_impls/attention.hpp"
#include "attention_impls/tiled_softmax.hpp"

namespace ab {

class ReducedKeysAttention : public Attention {
 public:
  size_t working_bytes(Mode mode) const override;
  void setup(Mode mode, Rng& rng) override;
  // Pass 1: K' = map_K(K), V' = map_V(V) per (b, h). Pass 2: the engine over the Nk keys.
  void forward(const AttnArgs& a) override;
  // The engine gives dQ, dK', dV'; then dK = map_K^T(dK'), dV = map_V^T(dV').
  void backward(const AttnArgs& a) override;

 protected:
  enum Which { kKeys = 0, kValues = 1 };
  ReducedKeysAttention(const AttnProblem& p, int64_t reduced);
  // Adds the map's products (and, with backward, its transpose's).
  virtual void plan_maps(MatmulCache& mm, Mode mode) const = 0;
  virtual size_t param_bytes() const = 0;
  virtual void draw_params(Rng& rng) = 0;
  // Xr (Nk x D, row stride D) = the map of X (N x D, row stride sn) for head h.
  virtual void reduce(const MatmulCache& mm, int tid, int64_t h, Which which, const float* X, float* Xr) const = 0;
  // dX (N x D, row stride sn, overwritten) = the transposed map of dXr.
  virtual void expand(const MatmulCache& mm, int tid, int64_t h, Which which, const float* dXr, float* dX) const = 0;

  AttnProblem p_;
  int64_t Nk_;

 private:
  void plan(Mode mode) const;
  size_t reduced_bytes() const;
  TensorView view(const Buffer<float>& buf) const;

  QKLogits qk_;
  mutable TiledSoftmax core_;
  mutable MatmulCache maps_;
  mutable bool planned_ = false;
  mutable Mode planned_mode_ = Mode::fwd;
  Buffer<float> Kr_, Vr_, dKr_, dVr_;
  Buffer<std::byte> scratch_;
};

}  // namespace ab
