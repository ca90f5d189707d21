// The frame of a mechanism that runs each (batch, head) pair whole on one thread (reformer,
// sinkhorn): its oneDNN products planned once per mode in a MatmulCache, one scratchpad slot per
// thread, and forward and backward handed out head by head.
#pragma once
#include <vector>

#include "attention_impls/attention.hpp"
#include "core/matmul.hpp"

namespace ab {

class PerHeadAttention : public Attention {
 public:
  void forward(const AttnArgs& a) override {
    for_each_head(problem_.shape, [&](int tid, int64_t b, int64_t h) { forward_head(a, tid, b, h); });
  }
  // With the parameters' gradients (param_grads), the pairs go to threads in a fixed order and
  // backward_done() then sums each thread's partial gradients in thread order, so the sum is
  // the same at every run with this thread count.
  void backward(const AttnArgs& a) override {
    if (!problem_.param_grads) {
      for_each_head(problem_.shape, [&](int tid, int64_t b, int64_t h) { backward_head(a, tid, b, h); });
      return;
    }
    begin_param_grads();
    const int64_t H = problem_.shape.H;
#pragma omp parallel for schedule(static, 1)
    for (int64_t bh = 0; bh < problem_.shape.B * H; ++bh) backward_head(a, omp_get_thread_num(), bh / H, bh % H);
    end_param_grads();
  }

 protected:
  explicit PerHeadAttention(const AttnProblem& p) : problem_(p) {}

  // One (batch, head) pair on thread `tid`.
  virtual void forward_head(const AttnArgs& a, int tid, int64_t b, int64_t h) const = 0;
  virtual void backward_head(const AttnArgs& a, int tid, int64_t b, int64_t h) const = 0;
  // The products a call in `mode` runs.
  virtual std::vector<MatmulSpec> products(Mode mode) const = 0;
  // param_grads: before the heads' backward passes (zero the partial sums), and after them (sum
  // the threads' partial sums, in thread order, into the gradients).
  virtual void begin_param_grads() {}
  virtual void end_param_grads() {}

  // Plans the products of `mode` (again only when the mode changes): analytic, no allocation.
  void plan(Mode mode) const {
    if (planned_ && planned_mode_ == mode) return;
    mm_.clear();
    for (const auto& sp : products(mode)) mm_.add(sp);
    planned_ = true;
    planned_mode_ = mode;
  }
  // The scratchpads of every thread's products (after plan).
  size_t scratchpad_bytes() const { return static_cast<size_t>(problem_.threads) * mm_.scratch_per_slot(); }
  // Setup's last step: plans `mode`, allocates the scratchpads and binds the products to them.
  void bind_products(Mode mode) {
    plan(mode);
    mode_ = mode;
    scratch_ = Buffer<std::byte>(scratchpad_bytes());
    mm_.bind(problem_.threads, scratch_.data());
  }

  AttnProblem problem_;
  Mode mode_ = Mode::fwd;  // what setup prepared
  mutable MatmulCache mm_;

 private:
  mutable bool planned_ = false;
  mutable Mode planned_mode_ = Mode::fwd;
  Buffer<std::byte> scratch_;
};

}  // namespace ab
