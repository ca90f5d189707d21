// The shared core of `linformer` and `memory_compressed`: softmax attention of the N queries
// over Nk keys and values made from K and V by a per-head linear map along the sequence
// (Linformer's projection E, F; the strided convolution's kernels Wk, Wv). A mechanism supplies
// how the map applies and its transpose for the backward pass; the maps' tensors (one for keys,
// one for values, or one shared), the reduced buffers, the tiled engine (over Nk keys) and the
// wiring are here.
//
// bf16 (--dtype bf16, forward): the maps (at setup) and each head's K and V rounded to bf16, the maps'
// products oneDNN bf16 matmuls with float output, then the engine's bf16 dense kernel over the
// reduced keys (which rounds Q, K', V' and P to bf16 and keeps the softmax in float).
#pragma once
#include "attention_impls/attention.hpp"
#include "attention_impls/tiled_softmax.hpp"

namespace ab {

class ReducedKeysAttention : public Attention {
 public:
  size_t working_bytes(Mode mode) const override;
  void setup(Mode mode, Rng& rng) override;
  // bf16: D of the engine's bf16 dense kernel (else InvalidInput).
  void validate() const override;
  // Pass 1: K' = map_K(K), V' = map_V(V) per (b, h) (bf16: each head's K and V rounded first,
  // the maps' bf16 copies made at setup). Pass 2: the engine over the Nk keys.
  void forward(const AttnArgs& a) override;
  // The engine gives dQ, dK', dV'; then dK = map_K^T(dK'), dV = map_V^T(dV').
  void backward(const AttnArgs& a) override;
  void set_dropout(const Dropout& d) override { core_.set_dropout(d); }

 protected:
  enum Which { kKeys = 0, kValues = 1 };
  // The maps hold `map_floats` floats per head each, drawn uniform in +-init_limit (the key map
  // first); `shared`: the value map is the key map.
  ReducedKeysAttention(const AttnProblem& p, int64_t reduced, int64_t map_floats, double init_limit, bool shared);
  // The mechanism's name, for messages.
  virtual const char* mechanism() const = 0;
  // Adds the map's products (and, with backward, its transpose's).
  virtual void plan_maps(MatmulCache& mm, Mode mode) const = 0;
  // Xr (Nk x D, row stride D, float) = the map of X (N x D, row stride ld_input()) for head h;
  // X and the map (input_map) hold bf16 numbers in a bf16 call, else floats.
  virtual void reduce(const MatmulCache& mm, int tid, int64_t h, Which which, const void* X, float* Xr) const = 0;
  // dX (N x D, row stride sn, overwritten) = the transposed map of dXr (Nk x D, row stride D).
  // In a bf16 call dXr and the map (input_map) hold bf16 numbers, else floats.
  virtual void expand(const MatmulCache& mm, int tid, int64_t h, Which which, const void* dXr, float* dX) const = 0;
  // With param_grads: dMap (map_floats, overwritten or accumulated into) = the gradient of the map
  // given its input X (N x D, row stride ld_input(): bf16 numbers in a bf16 call)
  // and the reduced rows' gradient dXr (as expand's).
  virtual void map_backward(const MatmulCache& mm, int tid, const void* X, const void* dXr, float* dMap,
                            bool accumulate) const = 0;
  // FLOPs of one map_backward.
  virtual double map_backward_flops() const = 0;
  // Training: the maps, with their gradients.
  std::vector<LearnedTensor> learned() override;
  // The FLOPs the maps' gradients add to a backward pass (param_grads), for flops().
  double param_grad_flops(Mode mode) const;

  // Head h's map of keys or values.
  const float* map(int64_t h, Which which) const;
  // What reduce() multiplies: float, or (bf16) copies rounded to bf16, the rows of X contiguous.
  bool bf16() const { return problem_.dtype == Dtype::bf16; }
  // bf16 under attention dropout: the engine's bf16 tiles over rounded copies of Q, K', V' (the
  // dense kernel has no dropout mask); the backward pass reads the forward's copies.
  bool tiles16() const { return bf16_tiles_for_dropout(problem_); }
  // Q, K', V' (inputs) and dO (dout) rounded into bwd_bf16_ for the engine's bf16 tiles;
  // bf16_pairs views a part of it as the engine takes it (two bf16 numbers to a float).
  void round_reduced(const AttnArgs& a, bool inputs, bool dout);
  TensorView bf16_pairs(int64_t offset, int64_t rows) const;
  // X (N x D, row stride sn) as reduce() and map_backward() read it: itself, or (bf16) rounded
  // into thread tid's rows (row stride D).
  const void* input_rows(int tid, const float* X);
  int64_t ld_input() const { return bf16() ? problem_.shape.D : problem_.strides.sn; }
  // Head h's map as reduce() multiplies it; element i of such an input, and row r of X.
  const void* input_map(int64_t h, Which which) const;
  const void* input_at(const void* x, int64_t i) const {
    return static_cast<const std::byte*>(x) + i * static_cast<int64_t>(bf16() ? sizeof(uint16_t) : sizeof(float));
  }
  const void* input_row(const void* X, int64_t r) const { return input_at(X, r * ld_input()); }
  // A product spec with A and B as reduce() reads them (bf16 in a bf16 call), C in float.
  MatmulSpec with_input_type(const MatmulSpec& spec) const { return bf16() ? spec.with_bf16_inputs() : spec; }
  // The names the dump and learned() give the two maps.
  virtual std::pair<const char*, const char*> map_names() const = 0;
  // The two maps as dump tensors of shape (H, ...per_head_shape).
  std::vector<DumpTensor> map_tensors(const char* key_name, const char* value_name,
                                      const std::vector<int64_t>& per_head_shape) const;

  AttnProblem problem_;
  int64_t Nk_;

 private:
  size_t map_bytes() const;
  void plan(Mode mode) const;
  size_t reduced_bytes() const;
  // bf16: the maps and, per thread, one head's K or V rounded to bf16 (backward: and the
  // engine's bf16 copies of Q, dO, K', V').
  size_t bf16_bytes(Mode mode) const;
  void round_maps();
  TensorView view(const Buffer<float>& buf) const;

  QKLogits qk_;
  QKLogits qk16_;  // bf16 backward: over the copies in bwd_bf16_
  mutable TiledSoftmax core_;
  mutable MatmulCache maps_;
  mutable bool planned_ = false;
  mutable Mode planned_mode_ = Mode::fwd;
  int64_t map_floats_;
  double init_limit_;
  bool shared_;
  Buffer<float> key_map_, value_map_, key_map_grad_, value_map_grad_;
  Buffer<float> Kr_, Vr_, dKr_, dVr_;
  Buffer<uint16_t> maps_bf16_, rows_bf16_, bwd_bf16_, grad_rows_bf16_;
  Buffer<std::byte> scratch_;
};

}  // namespace ab
