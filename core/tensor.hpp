// 4-D float32 tensor views (B, H, N, D) with strides. The innermost dimension D is always
// contiguous (oneDNN and the kernels need unit stride there); batch, head and row strides are
// free, so a (B, N, H, D) projection output can be viewed as (B, H, N, D) without a copy.
#pragma once
#include <cstdint>
#include <string>

#include "core/memory.hpp"

namespace ab {

struct Shape4 {
  int64_t B = 1, H = 1, N = 1, D = 1;
  int64_t numel() const { return B * H * N * D; }
  bool operator==(const Shape4&) const = default;
};

// Element strides of batch, head and row; the column stride is 1.
struct Strides3 {
  int64_t sb = 0, sh = 0, sn = 0;
  static Strides3 contiguous(const Shape4& s) { return {s.H * s.N * s.D, s.N * s.D, s.D}; }
  bool operator==(const Strides3&) const = default;
};

struct TensorView {
  float* data = nullptr;
  Shape4 shape;
  Strides3 strides;

  float* head(int64_t b, int64_t h) const { return data + b * strides.sb + h * strides.sh; }
  float* row(int64_t b, int64_t h, int64_t n) const { return head(b, h) + n * strides.sn; }
  float& at(int64_t b, int64_t h, int64_t n, int64_t d) const { return row(b, h, n)[d]; }
  // Row n alone: the (B, H, 1, D) window a decode step reads or writes.
  TensorView token(int64_t n) const {
    TensorView v = *this;
    v.data = data + n * strides.sn;
    v.shape.N = 1;
    return v;
  }
};

// An owning, contiguous, tracked tensor.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(const Shape4& s) : buf_(static_cast<size_t>(s.numel())) {
    view_ = TensorView{buf_.data(), s, Strides3::contiguous(s)};
  }
  const TensorView& view() const { return view_; }
  float* data() const { return buf_.data(); }
  size_t size() const { return buf_.size(); }
  const Shape4& shape() const { return view_.shape; }
  void zero() const { buf_.zero(); }

 private:
  Buffer<float> buf_;
  TensorView view_;
};

}  // namespace ab
