// The classification MLP: PyTorch's nn.Sequential(Linear, ReLU, ..., Linear) held as
// attribute `net`, so parameters are net.0.weight, net.0.bias, net.2.weight, ... Owns its
// layers and pre-allocated activations; trains with softmax cross-entropy on labels.
#pragma once
#include <vector>

#include "runtime/nn/layers.hpp"
#include "runtime/nn/model.hpp"

namespace cohort::nn {

class mlp : public model {
 public:
  /// in -> hidden[0] -> ... -> classes with ReLU between linears; weights and biases
  /// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) like nn.Linear's default. Activations are
  /// allocated for `max_batch` rows (a larger batch re-allocates them once).
  mlp(int in, std::vector<int> hidden, int classes, int max_batch, uint64_t seed,
      pool& p = pool::global());

  float forward_backward(const batch& b, float loss_scale) override;
  eval_result eval(const batch& b) override;
  std::string kind() const override { return "mlp"; }

  int in_features() const { return in_; }
  int classes() const { return classes_; }
  /// The linears in order; block i of blocks() is layer(i) (plus the ReLU after it).
  const std::vector<linear>& layers() const { return layers_; }

 private:
  void check(const batch& b) const;
  void reserve(int rows);
  /// Forward pass into acts_; returns the mean loss.
  float forward(const batch& b);

  int in_, classes_;
  int capacity_ = 0;
  std::vector<linear> layers_;
  std::vector<tensor> acts_;  // acts_[i]: output of layer i (after ReLU unless last)
  tensor probs_, losses_, dcur_, dnext_;
  tensor x_dev_;  // the batch on the device (unused on the CPU)
  itensor targets_dev_;
  const float* x_ = nullptr;  // the forwarded batch, where the device reads it
  const int32_t* targets_ = nullptr;
};

}  // namespace cohort::nn
