#pragma once
// Nothing of Gloo's errors is used by the shim: libtorch rethrows them as c10::Error.
