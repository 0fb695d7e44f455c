// The fiber scheduler behind warp_emu.h: one fiber per emulated thread of a block, resumed
// round-robin until each waits at a shuffle or barrier; a warp's shuffle completes once all its
// lanes have posted from one call site, a block barrier once every thread still running has
// arrived. An error of the emulated code (fail(), an exception out of the kernel body, lanes
// at different steps) is recorded for the block and thrown by run_grid from the scheduler.
// Fibers switch with a few instructions on x86-64 (ucontext's swapcontext makes a system call
// per switch, which made the suite ~3x slower), with ucontext elsewhere.
// Stacks: mmap'd, with an inaccessible guard below each (an overflow faults there instead
// of overwriting other memory; a SIGSEGV handler on its own stack names the overflow before the
// process ends), kept for the process so that a grid does not map and fill them again, and
// refilled with 0xff bytes before every block wherever the blocks before may have written.
#include "warp_emu.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__)
// switch_stack(save, next): pushes the callee-saved registers, stores the stack pointer in
// *save, loads `next` and pops the registers saved there (System V x86-64 ABI: rbx, rbp,
// r12-r15 are callee-saved; the others the caller of this function saves).
extern "C" void flash_kda_emu_switch_stack(void** save, void* next);
asm(R"(
.text
.globl flash_kda_emu_switch_stack
.type flash_kda_emu_switch_stack,@function
flash_kda_emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size flash_kda_emu_switch_stack,.-flash_kda_emu_switch_stack
.section .note.GNU-stack,"",@progbits
.text
)");
#else
#include <ucontext.h>
#endif

namespace flash_kda::emu {
namespace {

enum class Wait { Run, Shuffle, Warp, Block, Done };

/// A suspended execution: its saved stack pointer (x86-64) or ucontext.
struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc{};
#endif
};

/// Bytes of a fiber's stack (a kernel thread's frames take a few KB).
constexpr size_t kStackBytes = 256 * 1024;
/// Bytes of the inaccessible guard below each stack: more than any frame, so that an overflow
/// cannot step over it into the mapping below (another fiber's stack).
constexpr size_t kGuardBytes = 64 * 1024;
/// What every stack byte holds when a block starts: 0xff bytes are NaN as floats, so a read of
/// a variable before its first write shows in the tests' finite checks (zeros or the previous
/// block's values could pass).
constexpr unsigned char kStackFill = 0xff;
/// How far below the lowest written byte found so far Stack::measure looks for more: a frame
/// may leave bytes unwritten (arrays of a branch not taken) above bytes it writes; a gap wider
/// than this would hide what lies below it. The decode kernel's threads use ~3.5 KB of stack.
constexpr size_t kStackCleanRun = 4096;

/// A fiber's stack: kStackBytes of its own mapping above kGuardBytes of inaccessible guard,
/// filled with kStackFill. `dirty` bounds what the blocks run on it may have written (from the
/// top down), so that refilling before a block touches only that part.
class Stack {
 public:
  Stack() {
    void* m = mmap(nullptr, kGuardBytes + kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::runtime_error("flash_kda::emu: mmap of a fiber stack failed");
    map_ = static_cast<char*>(m);
    if (mprotect(map_, kGuardBytes, PROT_NONE) != 0) {
      munmap(map_, kGuardBytes + kStackBytes);
      throw std::runtime_error("flash_kda::emu: mprotect of a stack guard failed");
    }
    std::memset(base(), kStackFill, kStackBytes);
  }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  ~Stack() { munmap(map_, kGuardBytes + kStackBytes); }

  /// The lowest byte of the stack (the guard ends here).
  char* base() const { return map_ + kGuardBytes; }
  char* top() const { return base() + kStackBytes; }
  /// Whether `p` lies in the guard.
  bool in_guard(const void* p) const {
    const char* c = static_cast<const char*>(p);
    return c >= map_ && c < base();
  }
  /// Makes every byte a block may have written kStackFill again.
  void refill() { std::memset(top() - dirty_, kStackFill, dirty_); }
  /// After a block: extends `dirty` down to the lowest byte found written, scanning below the
  /// part known dirty until kStackCleanRun bytes in a row still hold the fill.
  void measure() {
    constexpr size_t kLine = 64;
    static const std::vector<unsigned char> clean(kLine, kStackFill);
    char* lowest = top() - dirty_;
    for (char* line = lowest - kLine; line >= base() && size_t(lowest - line) <= kStackCleanRun; line -= kLine)
      if (std::memcmp(line, clean.data(), kLine) != 0) lowest = line;
    dirty_ = size_t(top() - lowest);
  }

 private:
  char* map_ = nullptr;
  size_t dirty_ = 0;
};

struct Fiber {
  Context ctx;
  Stack* stack = nullptr;
  Wait wait = Wait::Run;
  uint64_t send = 0, result = 0;
  int src = 0;
  // A gather (src unused): `gather_bytes` posted at `send_at`, every lane's received at `receive_at`.
  const void* send_at = nullptr;
  void* receive_at = nullptr;
  size_t gather_bytes = 0;
  Site site;  // of the shuffle it waits at
  Coord coord;
};

/// Bytes past the end of the dynamic shared memory. All of it starts a block as 0xff bytes (NaN
/// as floats: a read before a write, or past the end, gives NaN that the tests' finite checks
/// see); a write past the end fails run_grid.
constexpr size_t kSmemGuardBytes = 4096;

struct Block {
  std::vector<Fiber> fibers;
  Context scheduler;
  const std::function<void()>* body = nullptr;
  std::vector<char> smem;
  std::string error;
};

// The kernels' static __shared__ variables (warp_emu.h places them in this section); the
// linker defines the bounds when the section exists (weak: null when no kernel has any).
extern "C" char __start_flash_kda_emu_shared[] __attribute__((weak));
extern "C" char __stop_flash_kda_emu_shared[] __attribute__((weak));

Block* g_block = nullptr;
Fiber* g_fiber = nullptr;

/// The stacks of the process's fibers, grown to the largest block run so far (run_grid is not
/// reentrant, so one block at a time uses them).
std::vector<std::unique_ptr<Stack>>& stacks() {
  static std::vector<std::unique_ptr<Stack>> s;
  return s;
}

std::string str(const uint3& u) {
  return "(" + std::to_string(u.x) + ", " + std::to_string(u.y) + ", " + std::to_string(u.z) + ")";
}
std::string where(const Fiber& f) { return "block " + str(f.coord.block) + " thread " + str(f.coord.thread); }
std::string str(const Site& s) { return std::string(s.file) + ":" + std::to_string(s.line); }
// One file's name is one literal in practice; strcmp only when the pointers differ.
bool same_site(const Site& a, const Site& b) {
  return a.line == b.line && (a.file == b.file || std::strcmp(a.file, b.file) == 0);
}

// The first error of the block wins (what follows it is a consequence).
void record_error(const std::string& what) {
  if (g_block->error.empty()) g_block->error = where(*g_fiber) + ": " + what;
}

// Writes the decimal digits of x to buf (async-signal-safe); returns the count.
size_t format_unsigned(unsigned x, char* buf) {
  char tmp[16];
  size_t n = 0;
  do tmp[n++] = char('0' + x % 10); while ((x /= 10) != 0);
  for (size_t i = 0; i < n; ++i) buf[i] = tmp[n - 1 - i];
  return n;
}

struct sigaction g_previous_segv;

// A fault in the running fiber's guard is a stack overflow: said on stderr, then the previous
// action is restored and the access faults again under it (by default ending the process).
void on_segv(int, siginfo_t* info, void*) {
  if (g_block != nullptr && g_fiber != nullptr && g_fiber->stack->in_guard(info->si_addr)) {
    char msg[160] = "flash_kda::emu: stack overflow of an emulated thread (thread.x ";
    size_t n = std::strlen(msg);
    n += format_unsigned(g_fiber->coord.thread.x, msg + n);
    const char mid[] = ", block.x ";
    std::memcpy(msg + n, mid, sizeof mid - 1);
    n += sizeof mid - 1;
    n += format_unsigned(g_fiber->coord.block.x, msg + n);
    const char tail[] = "): the guard below its stack faulted\n";
    std::memcpy(msg + n, tail, sizeof tail - 1);
    n += sizeof tail - 1;
    if (write(STDERR_FILENO, msg, n) < 0) {
    }
  }
  sigaction(SIGSEGV, &g_previous_segv, nullptr);
}

// The handler runs on a stack of its own: the faulting stack has no room left.
void install_overflow_handler() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  static std::vector<char> alt(64 * 1024);
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  sigaltstack(&ss, nullptr);
  struct sigaction sa{};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_previous_segv);
}

void switch_to(Context& save, Context& next) {
#if defined(__x86_64__)
  flash_kda_emu_switch_stack(&save.sp, next.sp);
#else
  swapcontext(&save.uc, &next.uc);
#endif
}

void yield() { switch_to(g_fiber->ctx, g_block->scheduler); }

// An exception must not leave the fiber (nothing above fiber_entry on its stack can take it):
// it becomes the block's error, which run_grid throws.
void fiber_entry() {
  try {
    (*g_block->body)();
  } catch (const std::exception& e) {
    record_error(std::string("exception: ") + e.what());
  } catch (...) {
    record_error("an exception not derived from std::exception");
  }
  g_fiber->wait = Wait::Done;
  yield();
  std::abort();  // a finished fiber is never resumed
}

// A fresh context that starts fiber_entry on `stack`.
void start_context(Context& c, char* stack, size_t bytes) {
#if defined(__x86_64__)
  // The stack as switch_stack leaves it: six callee-saved registers, then the return address
  // fiber_entry (entered with rsp = 8 mod 16, as after a call), above it a null return address
  // of fiber_entry's own, where a backtrace stops.
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top - 8);
  *sp = nullptr;
  *--sp = reinterpret_cast<void*>(&fiber_entry);
  for (int i = 0; i < 6; ++i) *--sp = nullptr;
  c.sp = sp;
#else
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, fiber_entry, 0);
#endif
}

// Completes the warp's shuffle or __syncwarp when every lane waits at one; an error when lanes
// wait at different kinds of step or shuffle sites, or some exited.
void settle_warp(Block& b, size_t first, size_t count) {
  size_t shuffles = 0, syncs = 0, done = 0;
  for (size_t i = first; i < first + count; ++i) {
    const Wait w = b.fibers[i].wait;
    if (w == Wait::Run || w == Wait::Block) return;
    shuffles += w == Wait::Shuffle, syncs += w == Wait::Warp, done += w == Wait::Done;
  }
  if (done == count) return;
  const std::string warp = "block " + str(b.fibers[first].coord.block) + " warp " + std::to_string(first / 32);
  if (done > 0 || (shuffles > 0 && syncs > 0))
    throw std::runtime_error(warp + ": lanes diverged at a warp-wide step (" + std::to_string(shuffles) + " at a shuffle, " +
                             std::to_string(syncs) + " at __syncwarp, " + std::to_string(done) + " exited)");
  if (shuffles == count) {
    const Site& site = b.fibers[first].site;
    for (size_t i = first + 1; i < first + count; ++i)
      if (!same_site(b.fibers[i].site, site))
        throw std::runtime_error(warp + ": lanes at different shuffle sites (lane 0 at " + str(site) + ", lane " +
                                 std::to_string(i - first) + " at " + str(b.fibers[i].site) + ")");
  }
  for (size_t i = first; i < first + count; ++i) {
    Fiber& f = b.fibers[i];
    if (f.wait == Wait::Shuffle && f.receive_at != nullptr) {
      // A gather: every lane's posted bytes, in lane order (the lanes wait, so their stacks hold them).
      for (size_t j = 0; j < count; ++j) {
        const Fiber& from = b.fibers[first + j];
        if (from.receive_at == nullptr || from.gather_bytes != f.gather_bytes)
          throw std::runtime_error(warp + ": lanes at different kinds of exchange at one site");
        std::memcpy(static_cast<char*>(f.receive_at) + j * f.gather_bytes, from.send_at, f.gather_bytes);
      }
    } else if (f.wait == Wait::Shuffle) {
      if (size_t(f.src) >= count) throw std::runtime_error(warp + ": shuffle from a lane the warp does not have");
      f.result = b.fibers[first + size_t(f.src)].send;
    }
  }
  for (size_t i = first; i < first + count; ++i) b.fibers[i].wait = Wait::Run;
}

void settle_block(Block& b) {
  size_t waiting = 0;
  for (const Fiber& f : b.fibers) {
    if (f.wait == Wait::Run || f.wait == Wait::Shuffle || f.wait == Wait::Warp) return;
    waiting += f.wait == Wait::Block;
  }
  if (waiting == 0) return;
  for (Fiber& f : b.fibers)
    if (f.wait == Wait::Block) f.wait = Wait::Run;
}

void run_block(Block& b, const uint3& block_idx, const dim3& grid, const dim3& block) {
  const size_t n = size_t(block.x) * block.y * block.z;
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = b.fibers[i];
    f.wait = Wait::Run;
    f.coord.thread = make_uint3(unsigned(i % block.x), unsigned(i / block.x % block.y), unsigned(i / block.x / block.y));
    f.coord.block = block_idx;
    f.coord.block_dim = block;
    f.coord.grid_dim = grid;
    f.stack->refill();
    start_context(f.ctx, f.stack->base(), kStackBytes);
  }
  std::fill(b.smem.begin(), b.smem.end(), char(0xff));
  if (__start_flash_kda_emu_shared != nullptr)
    std::fill(__start_flash_kda_emu_shared, __stop_flash_kda_emu_shared, char(0xff));
  // However the block ends, what it wrote on the stacks is found, so that the next block
  // (of this grid or another) gets them refilled.
  struct Measure {
    Block& b;
    ~Measure() {
      for (Fiber& f : b.fibers) f.stack->measure();
    }
  } measure{b};
  for (;;) {
    bool ran = false;
    for (size_t i = 0; i < n; ++i) {
      if (b.fibers[i].wait != Wait::Run) continue;
      g_fiber = &b.fibers[i];
      switch_to(b.scheduler, g_fiber->ctx);
      g_fiber = nullptr;
      if (!b.error.empty()) throw std::runtime_error(b.error);
      ran = true;
    }
    for (size_t w = 0; w < n; w += 32) settle_warp(b, w, std::min<size_t>(32, n - w));
    settle_block(b);
    bool all_done = true, runnable = false;
    for (size_t i = 0; i < n; ++i) {
      all_done = all_done && b.fibers[i].wait == Wait::Done;
      runnable = runnable || b.fibers[i].wait == Wait::Run;
    }
    if (all_done) {
      for (auto it = b.smem.end() - kSmemGuardBytes; it != b.smem.end(); ++it)
        if (*it != char(0xff)) throw std::runtime_error("a write past the end of the dynamic shared memory");
      return;
    }
    if (!runnable && !ran) throw std::runtime_error("threads of the block wait at a barrier that never completes");
    if (!runnable) throw std::runtime_error("threads of the block wait at steps that never complete");
  }
}

}  // namespace

const Coord& coord() {
  if (g_fiber == nullptr) throw std::logic_error("flash_kda::emu: a CUDA builtin used outside run_grid");
  return g_fiber->coord;
}

uint64_t shuffle(uint64_t bits, int src, Site site) {
  g_fiber->send = bits;
  g_fiber->src = src;
  g_fiber->receive_at = nullptr;
  g_fiber->site = site;
  g_fiber->wait = Wait::Shuffle;
  yield();
  return g_fiber->result;
}

void gather(const void* mine, size_t bytes, void* all, Site site) {
  g_fiber->send_at = mine;
  g_fiber->receive_at = all;
  g_fiber->gather_bytes = bytes;
  g_fiber->site = site;
  g_fiber->wait = Wait::Shuffle;
  yield();
}

void sync_warp() {
  g_fiber->wait = Wait::Warp;
  yield();
}

void sync_block() {
  g_fiber->wait = Wait::Block;
  yield();
}

char* dynamic_smem() { return g_block->smem.data(); }

void fail(const std::string& what) {
  if (g_fiber == nullptr) throw std::logic_error("flash_kda::emu: " + what + " (outside run_grid)");
  record_error(what);
  g_fiber->wait = Wait::Done;
  yield();
  std::abort();  // never resumed
}

void run_grid(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& body) {
  if (g_block != nullptr) throw std::logic_error("flash_kda::emu: run_grid inside a running grid");
  Block b;
  const size_t n = size_t(block.x) * block.y * block.z;
  if (n == 0 || n > 1024) throw std::invalid_argument("flash_kda::emu: a block of 1 to 1024 threads");
  install_overflow_handler();
  std::vector<std::unique_ptr<Stack>>& s = stacks();
  while (s.size() < n) s.push_back(std::make_unique<Stack>());
  b.fibers.resize(n);
  for (size_t i = 0; i < n; ++i) b.fibers[i].stack = s[i].get();
  b.body = &body;
  b.smem.resize(smem_bytes + kSmemGuardBytes);
  g_block = &b;
  try {
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) run_block(b, make_uint3(x, y, z), grid, block);
  } catch (...) {
    g_block = nullptr;
    throw;
  }
  g_block = nullptr;
}

}  // namespace flash_kda::emu
