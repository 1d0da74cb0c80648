#include "trainer/model/checkpoint.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <memory>
#include <string>
#include <utility>

namespace fusepack::model {
namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

class CheckpointBackward final : public Node {
 public:
  CheckpointBackward(at::Tensor input, CheckpointedFunction fn) : input_(std::move(input)), fn_(std::move(fn)) {}
  std::string name() const override { return "fusepack::CheckpointBackward"; }

  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    at::Tensor const x = input_.detach().requires_grad_(true);
    at::Tensor y;
    {
      at::AutoGradMode enable(true);
      y = fn_(x, /*recomputing=*/true);
    }
    torch::autograd::backward({y}, {grads[0]});
    input_.reset();  // this node runs once
    return {x.grad()};
  }

 private:
  at::Tensor input_;  // detached: it keeps the activation, not the graph that produced it
  CheckpointedFunction fn_;
};

}  // namespace

at::Tensor checkpointed(at::Tensor const& x, CheckpointedFunction fn) {
  if (!at::GradMode::is_enabled() || !x.requires_grad()) return fn(x, /*recomputing=*/false);
  at::Tensor y;
  {
    at::NoGradGuard no_grad;
    y = fn(x, /*recomputing=*/false);
  }
  auto node = std::shared_ptr<CheckpointBackward>(new CheckpointBackward(x.detach(), std::move(fn)),
                                                  torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(x));
  torch::autograd::create_gradient_edge(y, node);
  return y;
}

}  // namespace fusepack::model
