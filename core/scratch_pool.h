// Device scratch buffers reused across calls (bf16 partials, int8 signs, staged inputs).
// A block's last use is marked by an event; whoever takes it next makes its stream wait
// for that event, so concurrent calls on other streams never overwrite a block still
// being read.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "backends/device_backend.h"

namespace qlink {

class ScratchPool {
 public:
  struct Block {
    int device;
    void* ptr;
    size_t bytes;
    Event last_use;  // recorded when released; nullptr before the first release
    bool busy;
  };

  explicit ScratchPool(DeviceBackend& backend) : backend_(backend) {}
  ~ScratchPool();

  // A block of at least `bytes` on `device`, ordered after its previous use on `stream`.
  Status Acquire(int device, size_t bytes, Stream stream, Block** out);
  // Marks the block's last use as the work enqueued on `stream` (of its device) so far and
  // hands it back. A block whose mark cannot be recorded stays out of use until the pool
  // is destroyed: handed out unordered, it could be overwritten while still being read.
  Status Release(Block* block, Stream stream);

 private:
  DeviceBackend& backend_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Block>> blocks_;
};

// The scratch blocks one call takes, each given back marked with the stream of its last
// use on its device: by GiveBack at the end of a call that succeeded, which reports a
// failed mark, else by the destructor (an early return reports its own failure).
class BorrowedScratch {
 public:
  explicit BorrowedScratch(ScratchPool& pool) : pool_(pool) {}
  ~BorrowedScratch() { (void)GiveBack(); }
  BorrowedScratch(const BorrowedScratch&) = delete;
  BorrowedScratch& operator=(const BorrowedScratch&) = delete;

  // A block of at least `bytes` on `device`, used on `stream` (of that device) from now on.
  Status Take(int device, size_t bytes, Stream stream, void** out);
  // Gives every block taken so far back; the first failure, if any.
  Status GiveBack();

 private:
  ScratchPool& pool_;
  std::vector<std::pair<ScratchPool::Block*, Stream>> taken_;
};

}  // namespace qlink
