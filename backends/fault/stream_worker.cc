#include "backends/fault/stream_worker.h"

#include <utility>

namespace qlink {

void Completion::Set() {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  cv_.notify_all();
}

void Completion::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
}

StreamWorker::StreamWorker(std::chrono::milliseconds delay) : delay_(delay), thread_([this] { Run(); }) {}

StreamWorker::~StreamWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  thread_.join();
}

void StreamWorker::Enqueue(std::function<void()> work) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(std::move(work));
  ++enqueued_;
  cv_.notify_all();
}

void StreamWorker::Synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = enqueued_;
  cv_.wait(lock, [&] { return completed_ >= target; });
}

bool StreamWorker::Idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ == enqueued_;
}

void StreamWorker::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued has run
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    work();
    lock.lock();
    ++completed_;
    cv_.notify_all();
  }
}

}  // namespace qlink
