#include "core/scratch_pool.h"

namespace qlink {

ScratchPool::~ScratchPool() {
  for (auto& b : blocks_) {
    if (b->last_use != nullptr) backend_.DestroyEvent(b->device, b->last_use);
    backend_.Free(b->device, b->ptr);
  }
}

Status ScratchPool::Acquire(int device, size_t bytes, Stream stream, Block** out) {
  Block* found = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& b : blocks_) {
      if (!b->busy && b->device == device && b->bytes >= bytes && (found == nullptr || b->bytes < found->bytes)) {
        found = b.get();
      }
    }
    if (found != nullptr) found->busy = true;
  }
  if (found == nullptr) {
    auto block = std::make_unique<Block>(Block{device, nullptr, bytes, nullptr, true});
    QLINK_RETURN_IF_ERROR(backend_.Allocate(device, bytes, &block->ptr));
    found = block.get();
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.push_back(std::move(block));
  } else if (found->last_use != nullptr) {
    Status s = backend_.StreamWaitEvent(device, stream, found->last_use);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      found->busy = false;
      return s;
    }
  }
  *out = found;
  return Status::Ok();
}

Status ScratchPool::Release(Block* block, Stream stream) {
  if (block->last_use == nullptr) QLINK_RETURN_IF_ERROR(backend_.CreateEvent(block->device, &block->last_use));
  QLINK_RETURN_IF_ERROR(backend_.RecordEvent(block->device, block->last_use, stream));
  std::lock_guard<std::mutex> lock(mu_);
  block->busy = false;
  return Status::Ok();
}

Status BorrowedScratch::Take(int device, size_t bytes, Stream stream, void** out) {
  ScratchPool::Block* block = nullptr;
  QLINK_RETURN_IF_ERROR(pool_.Acquire(device, bytes, stream, &block));
  taken_.emplace_back(block, stream);
  *out = block->ptr;
  return Status::Ok();
}

Status BorrowedScratch::GiveBack() {
  Status first;
  for (auto& [block, stream] : taken_) {
    Status s = pool_.Release(block, stream);
    if (first.ok()) first = s;
  }
  taken_.clear();
  return first;
}

}  // namespace qlink
