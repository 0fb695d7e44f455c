// The CPU references' thread pool: every (sequence, value head) pair of a call, each pair run
// once, on up to a given number of threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace flash_kda::reference_detail {

/// Calls run(n, hv) for every sequence n < num_seqs and value head hv < value_heads, on up to
/// `num_threads` threads (0: one per hardware thread); pairs are handed out one at a time, in
/// order. The pairs must share no state and write disjoint memory: no locking is done around
/// them. The first exception a pair throws (e.g. std::bad_alloc) stops the handing out and is
/// re-thrown on the calling thread once every thread has finished.
template <class Run>
void for_each_pair(int64_t num_seqs, int64_t value_heads, int num_threads, Run&& run) {
  const int64_t tasks = num_seqs * value_heads;
  if (num_threads <= 0) num_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t workers = std::min<int64_t>(num_threads, tasks);
  std::atomic<int64_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&] {
    try {
      for (int64_t t = next++; t < tasks; t = next++) run(t / value_heads, t % value_heads);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next = tasks;
    }
  };
  if (workers <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(size_t(workers));
    for (int64_t i = 0; i < workers; ++i) pool.emplace_back(work);
    for (auto& t : pool) t.join();
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace flash_kda::reference_detail
