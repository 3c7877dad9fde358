// An asynchronous stream for the fault backend: one thread runs the stream's work in
// enqueue order, each piece after a fixed delay, so work completes after the call that
// enqueued it has returned, as on a GPU. A stream join core forgets then shows up as
// bytes read before they were written.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace qlink {

// The point an event was recorded at: done once its stream has run everything before it.
class Completion {
 public:
  void Set();
  void Wait();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

class StreamWorker {
 public:
  explicit StreamWorker(std::chrono::milliseconds delay);
  ~StreamWorker();  // runs what is queued, then stops

  void Enqueue(std::function<void()> work);
  void Synchronize();  // waits for everything enqueued so far
  bool Idle();

 private:
  void Run();

  const std::chrono::milliseconds delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members it uses exist
};

}  // namespace qlink
