#pragma once
// See ../README: the one member ProcessGroupGloo.hpp's inline code names; never defined here.
#include <chrono>
namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo
