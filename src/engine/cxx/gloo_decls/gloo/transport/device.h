#pragma once
// See ../../README: declarations only.
namespace gloo {
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo
