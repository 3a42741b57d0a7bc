// A small C shim over libtorch's own distributed pieces for jobs of several processes: the
// rendezvous store (c10d::TCPStore, under a PrefixStore per job) and the CPU process group
// (c10d::ProcessGroupGloo). Built against the wheel's headers (Gloo's own are declared in
// gloo_decls/); src/engine/parallel/c10d.rs is the Rust side. The store pointer it hands out is the same
// `c10::intrusive_ptr<c10d::Store>*` that nccl_shim.cpp's dflash_nccl_new takes.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <c10/util/Logging.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace {
void fail(char* err, size_t len, const std::string& msg) {
  if (err && len) {
    std::strncpy(err, msg.c_str(), len - 1);
    err[len - 1] = 0;
  }
}

using StorePtr = c10::intrusive_ptr<c10d::Store>;
using Gloo = c10::intrusive_ptr<c10d::ProcessGroupGloo>;

StorePtr& store_of(void* s) { return *static_cast<StorePtr*>(s); }
Gloo& gloo_of(void* g) { return *static_cast<Gloo*>(g); }
}  // namespace

extern "C" {

// libtorch's own log lines (a refused connection is logged with a C++ backtrace before it is
// thrown): only fatal ones from here on. The errors still reach the caller as messages.
void dflash_c10d_quiet() { FLAGS_caffe2_log_level = 3; }

// The job's store at host:port: rank 0 hosts it (is_server) unless a launcher's agent does;
// every key lives under `prefix`. Connecting waits up to timeout_ms for the server.
void* dflash_tcpstore_new(const char* host, int port, int is_server, int world, int timeout_ms,
                          const char* prefix, char* err, size_t len) {
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(port);
    opts.isServer = is_server != 0;
    opts.numWorkers = std::nullopt;
    opts.waitWorkers = false;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    StorePtr store = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), tcp);
    return new StorePtr(store);
  } catch (const std::exception& e) {
    fail(err, len, e.what());
    return nullptr;
  }
}

void dflash_c10d_store_free(void* s) { delete static_cast<StorePtr*>(s); }

int dflash_store_set(void* s, const char* key, const uint8_t* value, size_t n, char* err,
                     size_t len) {
  try {
    store_of(s)->set(key, std::vector<uint8_t>(value, value + n));
    return 0;
  } catch (const std::exception& e) {
    fail(err, len, e.what());
    return 1;
  }
}

// Whether `key` is set; when it is, its value (at most cap bytes copied, *n its full length).
int dflash_store_try_get(void* s, const char* key, uint8_t* out, size_t cap, size_t* n,
                         int* found, char* err, size_t len) {
  try {
    auto& store = store_of(s);
    *found = store->check({key}) ? 1 : 0;
    *n = 0;
    if (*found) {
      auto v = store->get(key);
      *n = v.size();
      std::memcpy(out, v.data(), std::min(cap, v.size()));
    }
    return 0;
  } catch (const std::exception& e) {
    fail(err, len, e.what());
    return 1;
  }
}

int dflash_store_add(void* s, const char* key, int64_t delta, int64_t* out, char* err,
                     size_t len) {
  try {
    *out = store_of(s)->add(key, delta);
    return 0;
  } catch (const std::exception& e) {
    fail(err, len, e.what());
    return 1;
  }
}

int dflash_store_delete(void* s, const char* key, char* err, size_t len) {
  try {
    store_of(s)->deleteKey(key);
    return 0;
  } catch (const std::exception& e) {
    fail(err, len, e.what());
    return 1;
  }
}

// Rank `rank` of `size` on the CPU; a collective that waits longer than timeout_ms for a peer
// fails instead of hanging.
void* dflash_gloo_new(void* s, int rank, int size, int timeout_ms, char* err, size_t len) {
  try {
    auto opts = c10d::ProcessGroupGloo::Options::create_default(
        std::chrono::milliseconds(timeout_ms));
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store_of(s), rank, size, opts);
    return new Gloo(pg);
  } catch (const std::exception& e) {
    fail(err, len, e.what());
    return nullptr;
  }
}

void dflash_gloo_free(void* g) { delete static_cast<Gloo*>(g); }

// In-place sum over all ranks of `tensor` (an at::Tensor*, as tch holds it); every rank ends with
// the same bits.
int dflash_gloo_allreduce_sum(void* g, void* tensor, char* err, size_t len) {
  try {
    std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    gloo_of(g)->allreduce(tensors, opts)->wait();
    return 0;
  } catch (const std::exception& e) {
    fail(err, len, e.what());
    return 1;
  }
}

int dflash_gloo_broadcast(void* g, void* tensor, int root, char* err, size_t len) {
  try {
    std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    gloo_of(g)->broadcast(tensors, opts)->wait();
    return 0;
  } catch (const std::exception& e) {
    fail(err, len, e.what());
    return 1;
  }
}

}  // extern "C"
