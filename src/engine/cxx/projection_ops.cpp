// Projections of one input by several trained weights (the drafter's q/k/v, its MLP's gate and
// up, any lone linear layer) as one autograd op whose backward accumulates inside the GEMMs:
// - each weight's gradient is added into its `.grad` by the GEMM itself (`addmm_`, beta 1)
//   instead of being made as a new tensor that autograd then adds to `.grad` in a separate pass
//   (a read of both and a write: 6 GB a step over the drafter's 1.05 billion bf16 weights at 8B);
// - the input's gradient from every weight is summed the same way, one GEMM onto the last, where
//   autograd would add the separate gradients pair by pair (three passes over [rows, hidden] a
//   layer for q, k and v).
// The weights get no gradient through autograd (their `.grad` is written here), so the caller
// hands in each `.grad`, zeroed before the step, and takes this op only where nothing hooks a
// weight's gradient accumulation. Runs wherever libtorch's GEMMs run (the CPU too).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <vector>

#include "shim_common.h"

namespace {

// y_j = x w_j^T for each weight w_j [out_j, in] of x [.., in]; the backward writes
// grad_j += dy_j^T x and gives dx = sum_j dy_j w_j.
struct ProjectInto : public torch::autograd::Function<ProjectInto> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, at::TensorList ws,
                                                const std::vector<at::Tensor>& grads) {
    TORCH_CHECK(!ws.empty() && ws.size() == grads.size(), "project_into: a .grad per weight");
    TORCH_CHECK(x.dim() >= 2, "project_into: x [.., in]");
    long long in = x.size(-1);
    for (size_t j = 0; j < ws.size(); ++j) {
      const at::Tensor &w = ws[j], &g = grads[j];
      TORCH_CHECK(w.dim() == 2 && w.size(1) == in && w.scalar_type() == x.scalar_type() &&
                      w.device() == x.device(),
                  "project_into: weights [out, in] of x's kind and device");
      TORCH_CHECK(g.defined() && g.sizes() == w.sizes() && g.scalar_type() == w.scalar_type() &&
                      g.device() == w.device() && g.stride(1) == 1 && g.stride(0) == in,
                  "project_into: each .grad a dense tensor shaped like its weight");
    }
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({x});
    ctx->saved_data["weights"] = ws.vec();
    ctx->saved_data["grads"] = grads;
    torch::autograd::variable_list out;
    out.reserve(ws.size());
    // matmul, not a view of mm's result: an output that is a view would refuse in-place ops.
    for (const at::Tensor& w : ws) out.push_back(at::matmul(x, w.t()));
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list dys) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    auto ws = ctx->saved_data["weights"].toTensorVector();
    auto grads = ctx->saved_data["grads"].toTensorVector();
    long long in = x.size(-1);
    at::Tensor rows = x.reshape({-1, in});
    bool wants_dx = ctx->needs_input_grad(0);
    at::Tensor dx;
    for (size_t j = 0; j < ws.size(); ++j) {
      if (!dys[j].defined()) continue;
      at::Tensor dy = dys[j].reshape({-1, ws[j].size(0)});
      grads[j].addmm_(dy.t(), rows);
      if (!wants_dx) continue;
      if (dx.defined()) {
        dx.addmm_(dy, ws[j]);
      } else {
        dx = at::mm(dy, ws[j]);
      }
    }
    // One gradient a forward input: x, each weight (written above, none through autograd), and
    // the .grad list (not a tensor input).
    torch::autograd::variable_list out(ws.size() + 2);
    if (dx.defined()) out[0] = dx.view(x.sizes());
    return out;
  }
};

}  // namespace

extern "C" {

// ProjectInto (above) of x by the n weights `ws`, whose .grad are `grads` (both arrays of
// `at::Tensor*`): n new tensors in `out`, differentiable in x; the weights' gradients go into
// `grads` during backward.
int dflash_project_into(void* x, void** ws, void** grads, int n, void** out) {
  return dflash::guarded([&] {
    std::vector<at::Tensor> weights, slots;
    for (int j = 0; j < n; ++j) {
      weights.push_back(*static_cast<at::Tensor*>(ws[j]));
      slots.push_back(*static_cast<at::Tensor*>(grads[j]));
    }
    // As a TensorList the weights are the op's inputs (autograd sees them); the .grad list not.
    auto ys = ProjectInto::apply(*static_cast<at::Tensor*>(x), at::TensorList(weights), slots);
    for (int j = 0; j < n; ++j) out[j] = new at::Tensor(std::move(ys[j]));
  });
}

}  // extern "C"
