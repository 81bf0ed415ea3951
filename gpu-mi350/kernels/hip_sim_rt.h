// m3's HIP simulator, second half: the block scheduler and the launchers.
// Appended after the kernel source by runtime/sim.rs, followed by one
// `M3SIM_EXPORT(kernel)` line a kernel. See hip_sim.h for what it models.

#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#if !defined(__x86_64__)
#error "the HIP simulator's fiber switch is written for x86-64"
#endif

// Save the callee-saved registers on the current stack, store the stack
// pointer in *save, switch to the stack at `load` and pop its registers
// (SysV x86-64; the vector registers are all caller-saved). A new fiber's
// stack is laid out so that the first switch to it "returns" into
// m3sim_start, which calls r13(r12) and never returns.
extern "C" void m3sim_swap(void** save, void* load);
extern "C" void m3sim_start();
asm(R"(
  .text
  .p2align 4
  .type m3sim_swap,@function
m3sim_swap:
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
  .size m3sim_swap, .-m3sim_swap
  .p2align 4
  .type m3sim_start,@function
m3sim_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size m3sim_start, .-m3sim_start
)");

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer (runtime/sim.rs, M3_SIM_ASAN=1) is told of every stack
// switch, so the fibers' frames are checked and never mistaken for overflows.
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old, size_t* size_old);
extern "C" void __asan_unpoison_memory_region(void const volatile* addr, size_t size);
#define M3SIM_ASAN 1
#endif

namespace m3sim {

Dim3 g_tid, g_bid, g_bdim, g_gdim;

/// One launch as runtime/sim.rs passes it (`SimLaunch`, same layout).
struct Launch {
  unsigned int grid[3];
  unsigned int block;
  unsigned int smem;
  void** params;
  /// Filled with why, when the launch fails (NUL-terminated).
  char err[512];
};

enum State : unsigned char { kRun, kAtBlock, kAtWave, kAtHalf, kAtNamed, kDone };

/// Named barriers (`bar.sync id, count`) a block may use.
constexpr unsigned kNamed = 16;

/// Lanes of the narrower collective group (a half wavefront).
constexpr unsigned kHalf = 32;

/// Bytes of a fiber's stack (a guard page below it).
constexpr size_t kStack = 256 * 1024;
constexpr unsigned kMaxThreads = 1024;

struct Block {
  unsigned n = 0, alive = 0, at_block = 0, cur = 0;
  void* sched = nullptr;
  void* sp[kMaxThreads];
  State st[kMaxThreads];
  /// Exchange parity a lane (which of two buffers its next collective of
  /// a kind uses: a buffer is rewritten only after a barrier of the group
  /// that every reader of its last use has passed).
  unsigned char par_full[kMaxThreads], par_half[kMaxThreads], par_mma[kMaxThreads];
  unsigned wave_alive[kMaxThreads / kWave], wave_at[kMaxThreads / kWave];
  unsigned half_alive[kMaxThreads / kHalf], half_at[kMaxThreads / kHalf];
  /// Lanes of each wavefront / half waiting at __syncthreads: inactive for
  /// the group's collectives (they count as arrived).
  unsigned wave_blk[kMaxThreads / kWave], half_blk[kMaxThreads / kHalf];
  /// Pauses of spinning threads since the block started.
  unsigned long long spins = 0;
  /// Arrivals at each named barrier, and which one a waiting thread is at.
  unsigned named_at[kNamed];
  unsigned char named_id[kMaxThreads];
  unsigned long long full[kMaxThreads / kWave][2][kWave];
  unsigned long long half[kMaxThreads / kHalf][2][kHalf];
  unsigned int mma[kMaxThreads / kHalf][2][kHalf * 6];
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
  const char* failed = nullptr;
  /// The scheduler's stack (told to AddressSanitizer on a switch back).
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
};

Block* g_blk = nullptr;
/// The fibers' stacks (made once, reused by every block).
std::vector<char*> g_stacks;

inline void yield_to_scheduler() {
  Block& b = *g_blk;
#if defined(M3SIM_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(b.st[b.cur] == kDone ? nullptr : &fake, b.sched_bottom, b.sched_size);
#endif
  m3sim_swap(&b.sp[b.cur], b.sched);
#if defined(M3SIM_ASAN)
  __sanitizer_finish_switch_fiber(fake, &b.sched_bottom, &b.sched_size);
#endif
}

/// Run fiber i until it waits or ends.
inline void switch_to(Block& b, unsigned i) {
#if defined(M3SIM_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, g_stacks[i], kStack);
#endif
  m3sim_swap(&b.sched, b.sp[i]);
#if defined(M3SIM_ASAN)
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

inline void release(State which, unsigned lo, unsigned hi) {
  Block& b = *g_blk;
  for (unsigned j = lo; j < hi; ++j)
    if (b.st[j] == which) b.st[j] = kRun;
}

void group_check(unsigned i);

/// Every thread at __syncthreads goes on (active again in its groups).
inline void release_block() {
  Block& b = *g_blk;
  b.at_block = 0;
  for (unsigned w = 0; w < (b.n + kWave - 1) / kWave; ++w) b.wave_blk[w] = 0;
  for (unsigned h = 0; h < (b.n + kHalf - 1) / kHalf; ++h) b.half_blk[h] = 0;
  release(kAtBlock, 0, b.n);
}

void block_barrier() {
  Block& b = *g_blk;
  if (b.at_block + 1 == b.alive) {
    release_block();
    return;
  }
  ++b.at_block;
  ++b.wave_blk[b.cur / kWave];
  ++b.half_blk[b.cur / kHalf];
  b.st[b.cur] = kAtBlock;
  // the lanes of its groups waiting at a collective may now all be there
  group_check(b.cur);
  yield_to_scheduler();
}

/// Arrive at the barrier of a group of lanes (`blk` of its live lanes wait
/// at __syncthreads: inactive here); the last to arrive releases the
/// others and goes on.
inline void group_arrive(unsigned& at, unsigned alive, unsigned blk, State st, unsigned lo, unsigned hi) {
  Block& b = *g_blk;
  if (at + 1 + blk >= alive) {
    at = 0;
    release(st, lo, hi);
    return;
  }
  ++at;
  b.st[b.cur] = st;
  yield_to_scheduler();
}

/// Release lane i's wavefront and half if every live lane of them is at
/// their collective or at __syncthreads.
void group_check(unsigned i) {
  Block& b = *g_blk;
  const unsigned w = i / kWave, h = i / kHalf;
  if (b.wave_at[w] > 0 && b.wave_at[w] + b.wave_blk[w] >= b.wave_alive[w]) {
    b.wave_at[w] = 0;
    release(kAtWave, w * kWave, w * kWave + kWave);
  }
  if (b.half_at[h] > 0 && b.half_at[h] + b.half_blk[h] >= b.half_alive[h]) {
    b.half_at[h] = 0;
    release(kAtHalf, h * kHalf, h * kHalf + kHalf);
  }
}

void wave_barrier(int width) {
  Block& b = *g_blk;
  if (width > (int)kHalf) {
    const unsigned w = b.cur / kWave;
    group_arrive(b.wave_at[w], b.wave_alive[w], b.wave_blk[w], kAtWave, w * kWave, w * kWave + kWave);
  } else {
    const unsigned h = b.cur / kHalf;
    group_arrive(b.half_at[h], b.half_alive[h], b.half_blk[h], kAtHalf, h * kHalf, h * kHalf + kHalf);
  }
}

void spin_yield() {
  Block& b = *g_blk;
  if (++b.spins > (1ull << 26)) trap("a spin-wait that never ended (2^26 pauses)");
  yield_to_scheduler();
}

void named_barrier(unsigned id, unsigned count) {
  Block& b = *g_blk;
  if (id >= kNamed) trap("bar.sync: barrier id past the simulator's 16");
  if (b.named_at[id] + 1 >= count) {
    b.named_at[id] = 0;
    for (unsigned j = 0; j < b.n; ++j)
      if (b.st[j] == kAtNamed && b.named_id[j] == id) b.st[j] = kRun;
    return;
  }
  ++b.named_at[id];
  b.named_id[b.cur] = (unsigned char)id;
  b.st[b.cur] = kAtNamed;
  yield_to_scheduler();
}

unsigned long long* wave_slots(int width, int* lane, int* base) {
  Block& b = *g_blk;
  const unsigned i = b.cur;
  *lane = (int)(i % kWave);
  if (width > (int)kHalf) {
    *base = 0;
    unsigned long long* s = b.full[i / kWave][b.par_full[i]];
    b.par_full[i] ^= 1u;
    return s;
  }
  *base = (int)(i % kWave) & (int)kHalf;
  unsigned long long* s = b.half[i / kHalf][b.par_half[i]];
  b.par_half[i] ^= 1u;
  return s;
}

const unsigned int* gather32(const unsigned int* a, unsigned int b0, unsigned int b1) {
  Block& b = *g_blk;
  const unsigned i = b.cur;
  unsigned int* s = b.mma[i / kHalf][b.par_mma[i]];
  b.par_mma[i] ^= 1u;
  unsigned int* mine = s + (i % kHalf) * 6;
  for (int k = 0; k < 4; ++k) mine[k] = a[k];
  mine[4] = b0;
  mine[5] = b1;
  wave_barrier((int)kHalf);
  return s;
}

[[noreturn]] void trap(const char* why) {
  Block& b = *g_blk;
  b.failed = why;
  for (;;) {
    b.st[b.cur] = kDone;
    yield_to_scheduler();
  }
}

/// A fiber's life: the kernel body, then leave every barrier's count.
void fiber_main(void*) {
  Block& b = *g_blk;
#if defined(M3SIM_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &b.sched_bottom, &b.sched_size);
#endif
  b.body(b.arg);
  const unsigned i = b.cur;
  b.st[i] = kDone;
  --b.alive;
  --b.wave_alive[i / kWave];
  --b.half_alive[i / kHalf];
  // the barriers it no longer holds up
  if (b.at_block > 0 && b.at_block == b.alive) release_block();
  group_check(i);
  yield_to_scheduler();
  __builtin_unreachable();
}

inline bool ensure_stacks(unsigned n, char* err) {
  while (g_stacks.size() < n) {
    const long page = sysconf(_SC_PAGESIZE);
    void* m = mmap(nullptr, kStack + (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
      std::snprintf(err, 512, "could not map a fiber stack (%u threads)", n);
      return false;
    }
    mprotect(m, (size_t)page, PROT_NONE);  // overflow faults instead of corrupting
    g_stacks.push_back((char*)m + page);
  }
  return true;
}

/// Run one block to completion; false (and `err`) on a deadlock or trap.
inline bool run_block(Block& b, const char* kernel, char* err) {
  b.alive = b.n;
  b.at_block = 0;
  b.spins = 0;
  for (unsigned k = 0; k < kNamed; ++k) b.named_at[k] = 0;
  const unsigned waves = (b.n + kWave - 1) / kWave;
  for (unsigned w = 0; w < waves; ++w) {
    b.wave_at[w] = 0;
    b.wave_blk[w] = 0;
    const unsigned lo = w * kWave, hi = lo + kWave < b.n ? lo + kWave : b.n;
    b.wave_alive[w] = hi - lo;
  }
  for (unsigned h = 0; h < (b.n + kHalf - 1) / kHalf; ++h) {
    b.half_at[h] = 0;
    b.half_blk[h] = 0;
    const unsigned lo = h * kHalf, hi = lo + kHalf < b.n ? lo + kHalf : b.n;
    b.half_alive[h] = hi - lo;
  }
  for (unsigned i = 0; i < b.n; ++i) {
    b.st[i] = kRun;
    b.par_full[i] = b.par_half[i] = b.par_mma[i] = 0;
#if defined(M3SIM_ASAN)
    // a fiber left at a barrier by a failed block leaves poisoned frames
    __asan_unpoison_memory_region(g_stacks[i], kStack);
#endif
    void** top = (void**)(g_stacks[i] + kStack);
    top[-1] = (void*)&m3sim_start;    // "returned" into by the first switch
    top[-2] = nullptr;                // rbp
    top[-3] = nullptr;                // rbx
    top[-4] = nullptr;                // r12: fiber_main's argument
    top[-5] = (void*)&fiber_main;     // r13
    top[-6] = nullptr;                // r14
    top[-7] = nullptr;                // r15
    b.sp[i] = (void*)(top - 7);
  }
  b.failed = nullptr;
  while (b.alive > 0 && !b.failed) {
    bool ran = false;
    for (unsigned i = 0; i < b.n && !b.failed; ++i) {
      if (b.st[i] != kRun) continue;
      ran = true;
      b.cur = i;
      g_tid = {i, 0u, 0u};
      switch_to(b, i);
    }
    if (!ran) {
      unsigned at_b = 0, at_w = 0;
      for (unsigned i = 0; i < b.n; ++i) {
        at_b += b.st[i] == kAtBlock;
        at_w += b.st[i] == kAtWave || b.st[i] == kAtHalf || b.st[i] == kAtNamed;
      }
      std::snprintf(err, 512,
                    "%s: deadlock in block (%u,%u,%u) of %u threads: %u at __syncthreads, %u at a wavefront "
                    "collective or named barrier, %u returned",
                    kernel, g_bid.x, g_bid.y, g_bid.z, b.n, at_b, at_w, b.n - b.alive);
      return false;
    }
  }
  if (b.failed) {
    std::snprintf(err, 512, "%s: %s in block (%u,%u,%u), thread %u", kernel, b.failed, g_bid.x, g_bid.y, g_bid.z,
                  b.cur);
    return false;
  }
  return true;
}

template <typename... A, std::size_t... I>
inline void call(void (*k)(A...), void** p, std::index_sequence<I...>) {
  k(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(p[I])...);
}

template <typename... A> struct Job {
  void (*k)(A...);
  void** p;
  static void run(void* self) {
    Job* j = (Job*)self;
    call(j->k, j->p, std::index_sequence_for<A...>{});
  }
};

/// Every block of the launch, in order; 0, or 1 with `L->err` set.
template <typename... A> inline int launch(void (*k)(A...), const char* name, Launch* L) {
  if (L->block == 0 || L->block > kMaxThreads) {
    std::snprintf(L->err, sizeof L->err, "%s: %u threads a block (1..%u)", name, L->block, kMaxThreads);
    return 1;
  }
  if (!ensure_stacks(L->block, L->err)) return 1;
  static Block b;
  Job<A...> job{k, L->params};
  b.n = L->block;
  b.body = &Job<A...>::run;
  b.arg = &job;
  Block* outer = g_blk;
  g_blk = &b;
  g_bdim = {L->block, 1u, 1u};
  g_gdim = {L->grid[0], L->grid[1], L->grid[2]};
  int rc = 0;
  for (unsigned z = 0; z < L->grid[2] && rc == 0; ++z)
    for (unsigned y = 0; y < L->grid[1] && rc == 0; ++y)
      for (unsigned x = 0; x < L->grid[0] && rc == 0; ++x) {
        g_bid = {x, y, z};
        if (!run_block(b, name, L->err)) rc = 1;
      }
  g_blk = outer;
  return rc;
}

/// The argument sizes of kernel `k` into `sizes` (at most `cap`); the count.
template <typename... A> inline int sig(void (*)(A...), unsigned long long* sizes, int cap) {
  const unsigned long long s[] = {0ull, (unsigned long long)sizeof(A)...};
  const int n = (int)sizeof...(A);
  for (int i = 0; i < n && i < cap; ++i) sizes[i] = s[i + 1];
  return n;
}

}  // namespace m3sim

#define M3SIM_EXPORT(name)                                                                            \
  extern "C" __attribute__((visibility("default"))) int m3sim_launch_##name(m3sim::Launch* L) {       \
    return m3sim::launch(name, #name, L);                                                           \
  }                                                                                                   \
  extern "C" __attribute__((visibility("default"))) int m3sim_sig_##name(unsigned long long* s, int c) { \
    return m3sim::sig(name, s, c);                                                                    \
  }
