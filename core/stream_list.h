// The stream list every entry point takes (qlink_stream: one stream per device, the
// device's default stream where none is listed): checked once, then looked up per device.
#pragma once

#include <cstddef>

#include "core/context.h"

namespace qlink {

// Checks a host-supplied stream list against the context's devices.
Status CheckStreams(const Context& ctx, const qlink_stream* streams, size_t num_streams);

// The stream listed for `device`, else its default stream.
Stream StreamFor(int device, const qlink_stream* streams, size_t num_streams);

}  // namespace qlink
