// A small C shim over libtorch's own NCCL process group (c10d::ProcessGroupNCCL), so that drafter
// replicas on several GPUs of one process average gradients with NCCL: one rank per drafter
// thread, all ranks meeting through an in-process HashStore.
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace {
void set_error(char* err, size_t len, const std::string& msg) {
  if (err && len) {
    std::strncpy(err, msg.c_str(), len - 1);
    err[len - 1] = 0;
  }
}
using Group = c10::intrusive_ptr<c10d::ProcessGroupNCCL>;

// Gradient buckets all-reduced while backward runs: a hook on each parameter's gradient
// accumulator counts the parameters of its bucket down; when a bucket is complete and every
// bucket before it has been launched, its all-reduce (mean) goes out on NCCL's own stream, which
// first waits for the work queued so far on the current stream. Buckets go out in their fixed
// order on every rank, as NCCL needs.
struct Reducer {
  Group group;
  std::vector<std::vector<at::Tensor>> spans;  // per bucket: views into the flat gradients
  std::vector<int> param_bucket;
  std::vector<int> size;  // parameters per bucket
  std::vector<int> pending;
  std::vector<char> fired;  // per parameter, this backward
  size_t next = 0;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks;
  std::mutex mu;
  std::string error;

  void launch_ready() {
    while (next < pending.size() && pending[next] <= 0) {
      for (auto& view : spans[next]) {
        std::vector<at::Tensor> tensors{view};
        c10d::AllreduceOptions opts;
        opts.reduceOp = c10d::ReduceOp::AVG;
        works.push_back(group->allreduce(tensors, opts));
      }
      next++;
    }
  }

  // After an error nothing more is launched this step (`finish` reports it); a parameter whose
  // gradient arrives twice in one backward is an error (its bucket may have gone out already).
  void ready(size_t param) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error.empty()) return;
    try {
      if (fired[param]) throw std::runtime_error("a parameter's gradient arrived twice in one backward");
      fired[param] = 1;
      int b = param_bucket[param];
      if (--pending[b] == 0) launch_ready();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }

  // Arms the buckets for the next backward.
  void rearm() {
    works.clear();
    pending = size;
    std::fill(fired.begin(), fired.end(), 0);
    next = 0;
  }

  void unhook() {
    for (auto& [acc, key] : hooks) acc->del_post_hook(key);
    hooks.clear();
  }
};

struct ReadyHook : torch::autograd::FunctionPostHook {
  Reducer* reducer;
  size_t param;
  ReadyHook(Reducer* r, size_t p) : reducer(r), param(p) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    reducer->ready(param);
    return outputs;
  }
};
}  // namespace

extern "C" {

// An in-process store the ranks rendezvous through.
void* dflash_store_new() {
  auto store = c10::make_intrusive<c10d::HashStore>();
  return new c10::intrusive_ptr<c10d::Store>(store);
}

void dflash_store_free(void* store) {
  delete static_cast<c10::intrusive_ptr<c10d::Store>*>(store);
}

// Rank `rank` of `size`, on the current CUDA device of the calling thread.
void* dflash_nccl_new(void* store, int rank, int size, char* err, size_t err_len) {
  try {
    auto s = *static_cast<c10::intrusive_ptr<c10d::Store>*>(store);
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(s, rank, size, opts);
    return new c10::intrusive_ptr<c10d::ProcessGroupNCCL>(pg);
  } catch (const std::exception& e) {
    set_error(err, err_len, e.what());
    return nullptr;
  }
}

void dflash_nccl_free(void* pg) {
  auto* group = static_cast<c10::intrusive_ptr<c10d::ProcessGroupNCCL>*>(pg);
  try {
    (*group)->shutdown();
  } catch (...) {
  }
  delete group;
}

// In-place mean over all ranks of `tensor` (an at::Tensor*, as tch holds it). The wait makes the
// caller's current stream wait for NCCL; the host does not block.
int dflash_nccl_allreduce_mean(void* pg, void* tensor, char* err, size_t err_len) {
  try {
    auto& group = *static_cast<c10::intrusive_ptr<c10d::ProcessGroupNCCL>*>(pg);
    std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::AVG;
    group->allreduce(tensors, opts)->wait();
    return 0;
  } catch (const std::exception& e) {
    set_error(err, err_len, e.what());
    return 1;
  }
}

// Aborts the communicators of rank `pg` (from any thread): its collectives that wait for a rank
// that is gone end instead of hanging.
int dflash_nccl_abort(void* pg) {
  try {
    (*static_cast<Group*>(pg))->abort();
    return 0;
  } catch (...) {
    return 1;
  }
}

// Copies rank `root`'s `tensor` to every rank (in place), and waits on the current stream.
int dflash_nccl_broadcast(void* pg, void* tensor, int root, char* err, size_t err_len) {
  try {
    auto& group = *static_cast<Group*>(pg);
    std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    group->broadcast(tensors, opts)->wait();
    return 0;
  } catch (const std::exception& e) {
    set_error(err, err_len, e.what());
    return 1;
  }
}

// A reducer over `n` parameters (at::Tensor*, whose .grad are views into `flat`): parameter i
// belongs to bucket param_bucket[i]; bucket b is the spans j with span_bucket[j] == b, each
// (span_off[j], span_len[j]) of `flat`. Call from the thread that runs backward's forward pass.
void* dflash_reducer_new(void* pg, void** params, int n, void* flat, const int* param_bucket,
                         int buckets, const int* span_bucket, const int64_t* span_off,
                         const int64_t* span_len, int spans, char* err, size_t err_len) {
  try {
    auto r = std::make_unique<Reducer>();
    r->group = *static_cast<Group*>(pg);
    const auto& grads = *static_cast<at::Tensor*>(flat);
    r->spans.resize(buckets);
    r->size.assign(buckets, 0);
    for (int j = 0; j < spans; j++) {
      TORCH_CHECK(span_bucket[j] >= 0 && span_bucket[j] < buckets, "span in no bucket");
      r->spans[span_bucket[j]].push_back(grads.narrow(0, span_off[j], span_len[j]));
    }
    r->param_bucket.assign(param_bucket, param_bucket + n);
    for (int i = 0; i < n; i++) {
      TORCH_CHECK(param_bucket[i] >= 0 && param_bucket[i] < buckets, "parameter in no bucket");
      r->size[param_bucket[i]]++;
    }
    r->fired.assign(n, 0);
    r->rearm();
    try {
      for (int i = 0; i < n; i++) {
        const auto& p = *static_cast<at::Tensor*>(params[i]);
        auto acc = torch::autograd::impl::grad_accumulator(p);
        TORCH_CHECK(acc, "a parameter that does not require grad");
        auto key = acc->add_post_hook(std::make_unique<ReadyHook>(r.get(), static_cast<size_t>(i)));
        r->hooks.emplace_back(acc, key);
      }
    } catch (...) {
      r->unhook();  // no hook may outlive the reducer
      throw;
    }
    return r.release();
  } catch (const std::exception& e) {
    set_error(err, err_len, e.what());
    return nullptr;
  }
}

// After backward: launches the buckets no hook completed (parameters that got no gradient),
// makes the current stream wait for every all-reduce, and arms the buckets for the next step.
int dflash_reducer_finish(void* reducer, char* err, size_t err_len) {
  auto* r = static_cast<Reducer*>(reducer);
  try {
    std::lock_guard<std::mutex> lock(r->mu);
    if (!r->error.empty()) {
      std::string e = r->error;
      r->error.clear();
      throw std::runtime_error(e);
    }
    for (auto& p : r->pending) p = 0;
    r->launch_ready();
    for (auto& w : r->works) w->wait();
    r->rearm();
    return 0;
  } catch (const std::exception& e) {
    r->rearm();
    set_error(err, err_len, e.what());
    return 1;
  }
}

void dflash_reducer_free(void* reducer) {
  auto* r = static_cast<Reducer*>(reducer);
  r->unhook();
  delete r;
}
}
