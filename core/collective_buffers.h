// What the in-process collectives share about their buffers: the check of one fp32
// buffer per device, and where one device reads a buffer of another.
#pragma once

#include <cstdint>
#include <vector>

#include "core/context.h"
#include "core/scratch_pool.h"

namespace qlink {

Status CheckFp32(const DLTensor& t, const char* side, size_t i);

// One fp32 buffer per device, all of one size, no two overlapping, at most
// kMaxParticipants (one ReduceSum takes them all). Gives the byte size and the buffers'
// indices in device-index order.
Status CheckPerDevice(const Context& ctx, const DLTensor* t, size_t n, const char* side, uint64_t* bytes,
                      std::vector<size_t>* order);

// Whether `reader` may read `owner`'s memory in place: the same device, a peer link, or
// host memory shared by a backend without peer access (the CPU backend's virtual devices).
bool DirectlyReadable(Context& ctx, int reader, int owner);

// Where `reader` reads `bytes` of `owner`'s memory at `ptr`: in place where it directly
// can, else from a scratch copy staged by the runtime on `stream` (of reader).
Status Readable(Context& ctx, int reader, int owner, const void* ptr, size_t bytes, Stream stream,
                BorrowedScratch* scratch, const void** out);

}  // namespace qlink
