// A small C shim over libtorch's own NCCL process group (c10d::ProcessGroupNCCL), so that drafter
// replicas on several GPUs of one process average gradients with NCCL: one rank per drafter
// thread, all ranks meeting through an in-process HashStore.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <cstring>
#include <string>

namespace {
void set_error(char* err, size_t len, const std::string& msg) {
  if (err && len) {
    std::strncpy(err, msg.c_str(), len - 1);
    err[len - 1] = 0;
  }
}
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
}
