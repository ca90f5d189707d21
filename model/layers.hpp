// The Transformer's layers, forward and backward side by side (llm.c style): plain functions
// with their shapes in comments for the element-wise work, and thin classes over the oneDNN
// primitives (matmul, layer normalisation, eltwise GELU) created once in untimed setup.
//
// Every primitive runs with a user scratchpad (the model's one tracked scratch region) and with
// memory objects made once whose data handles are swapped per call, so a step allocates no
// buffer. All of them run outside any OpenMP region and parallelise themselves.
#pragma once
#include <cstddef>
#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "core/matmul.hpp"

namespace ab {

// A oneDNN primitive with its argument memories made once; run() sets their data handles.
class BoundPrimitive {
 public:
  BoundPrimitive() = default;
  BoundPrimitive(dnnl::primitive prim, const dnnl::memory::desc& scratch_desc) : prim_(std::move(prim)), scratch_desc_(scratch_desc) {}
  // Declares argument `arg` (DNNL_ARG_*); run() takes the pointers in declaration order.
  void arg(int arg, const dnnl::memory::desc& md);
  size_t scratchpad_bytes() const { return scratch_desc_.get_size(); }
  void bind(std::byte* scratch);
  void run(std::initializer_list<const void*> ptrs) const;

 private:
  dnnl::primitive prim_;
  dnnl::memory::desc scratch_desc_;
  std::vector<dnnl::memory> mems_;
  std::vector<dnnl_exec_arg_t> args_;
};

// Y (M, N) = X (M, K) · W (K, N) + b (N); W row-major, or (weights_nk) stored as (N, K) and
// read transposed (a tied output layer: the embedding table). bf16: X and W hold bf16 numbers (the
// caller rounds them), the product accumulates in float and Y and b are float; in the backward
// pass X, W and dY enter both products as bf16 numbers too (PyTorch's CPU autocast), dX and dW
// come out in float. b is null exactly when the layer has no bias.
class Linear {
 public:
  Linear() = default;
  // bias: forward() adds b inside the product (oneDNN's bias argument, not a second pass over Y).
  Linear(int64_t M, int64_t K, int64_t N, bool with_backward, bool bf16 = false, bool weights_nk = false, bool bias = true);
  size_t scratchpad_bytes() const;
  void bind(std::byte* scratch);
  double forward_flops() const { return 2.0 * M_ * N_ * K_; }
  void forward(const void* X, const void* W, const float* b, float* Y) const;
  // dX (M, K) = dY · W^T; dW (K, N) = X^T · dY (weights_nk: (N, K) = dY^T · X); db (N) = column
  // sums of dY (none when db is null). Overwrites all three. X and W as the products read them
  // (floats, or bf16 numbers in a bf16 layer). bf16: dY_bf16 (M, N) receives dY rounded, in the
  // same pass over dY as db's sums, and the products read it; db sums the float dY.
  void backward(const void* X, const void* W, const float* dY, uint16_t* dY_bf16, float* dX, float* dW, float* db) const;
  void backward(const float* X, const float* W, const float* dY, float* dX, float* dW, float* db) const {
    backward(X, W, dY, nullptr, dX, dW, db);
  }
  int64_t M() const { return M_; }

 private:
  int64_t M_ = 0, K_ = 0, N_ = 0;
  bool weights_nk_ = false, bf16_ = false;
  Matmul fwd_, bwd_data_, bwd_weights_;
};

// Layer normalisation over the last axis of (rows, cols), learned scale g and shift b, with the
// mean and variance kept for the backward pass (oneDNN layer_normalization, eps 1e-6 as LRA).
class LayerNorm {
 public:
  LayerNorm() = default;
  LayerNorm(int64_t rows, int64_t cols, bool with_backward);
  size_t scratchpad_bytes() const;
  void bind(std::byte* scratch);
  // y = (x - mean) / sqrt(var + eps) * g + b; mean, var (rows).
  void forward(const float* x, const float* g, const float* b, float* y, float* mean, float* var) const;
  // dx (rows, cols), dg, db (cols): overwritten.
  void backward(const float* x, const float* mean, const float* var, const float* dy, const float* g,
                const float* b, float* dx, float* dg, float* db) const;

 private:
  BoundPrimitive fwd_, bwd_;
};

// GELU (tanh approximation, oneDNN eltwise_gelu_tanh) over n elements.
class Gelu {
 public:
  Gelu() = default;
  Gelu(int64_t n, bool with_backward);
  size_t scratchpad_bytes() const;
  void bind(std::byte* scratch);
  void forward(const float* u, float* g) const;
  // du = gelu'(u) * dg; du may be dg.
  void backward(const float* u, const float* dg, float* du) const;

 private:
  BoundPrimitive fwd_, bwd_;
};

// ---- element-wise passes (OpenMP over rows) ----

// x (B·S, d): a sequence's S rows are G global rows (globals (G, d), ETC's learned extra tokens;
// G = 0 for every other mechanism) then its S - G tokens, E[tokens] + positions ((S - G, d);
// none when null) (+ cls at the first token when cls is not null). tokens (B·S): the global rows'
// entries are not read.
void embedding_forward(const int32_t* tokens, int64_t rows, int64_t S, int64_t G, int64_t d, const float* E,
                       const float* positions, const float* cls, const float* globals, float* x);
// dE += scatter of dx by token over the token rows; dcls = sum of dx over the first token rows,
// dpos (S - G, d) = sum of dx over the sequences, dglobals (G, d) = sum of dx over the global
// rows (each when not null). Columns are shared out over the threads, so the scatter has no races
// and a fixed order.
void embedding_backward(const int32_t* tokens, int64_t rows, int64_t S, int64_t G, int64_t d, const float* dx,
                        float* dE, float* dcls, float* dglobals, float* dpos = nullptr);
// The sinusoidal table of Vaswani et al.: P[n, 2i] = sin(n / 10000^(2i/d)), P[n, 2i+1] = cos(...).
void sinusoidal_positions(int64_t N, int64_t d, float* P);

// qkv (B·N, 3·H·Dh), laid out [q heads | k heads | v heads] per row -> q, k, v (B, H, N, Dh).
void split_heads(const float* qkv, int64_t B, int64_t N, int64_t H, int64_t Dh, float* q, float* k, float* v);
// The inverse: q, k, v (B, H, N, Dh) -> qkv (B·N, 3·H·Dh).
void merge_qkv(const float* q, const float* k, const float* v, int64_t B, int64_t N, int64_t H, int64_t Dh, float* qkv);
// o (B, H, N, Dh) -> a (B·N, H·Dh), and back.
void merge_heads(const float* o, int64_t B, int64_t N, int64_t H, int64_t Dh, float* a);
// The same, a rounded to bf16 on the way (a bf16 layer's input: one pass instead of two).
void merge_heads(const float* o, int64_t B, int64_t N, int64_t H, int64_t Dh, uint16_t* a);
void split_single(const float* a, int64_t B, int64_t N, int64_t H, int64_t Dh, float* o);

// y += x, n elements.
void add_inplace(float* y, const float* x, int64_t n);

// Softmax cross-entropy over rows of logits (rows, C) with oneDNN's softmax applied first (the
// logits are turned into probabilities in place). target[r] < 0: the row does not count.
// Returns the mean loss over counted rows; writes dlogits = (p - onehot) / counted into `probs`
// when `with_grad`, zero on rows that do not count.
double cross_entropy(float* probs, const int32_t* target, int64_t rows, int64_t C, bool with_grad);

// AdamW (Loshchilov & Hutter): decoupled weight decay, bias-corrected moments; `step` from 1.
struct AdamW {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
  void update(float* w, const float* g, float* m, float* v, int64_t n, int64_t step) const;
};

}  // namespace ab
