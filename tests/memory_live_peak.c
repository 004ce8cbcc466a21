/* LD_PRELOAD helper of tests/memory_model_check.py: counts the bytes the process holds from
 * malloc / calloc / realloc / posix_memalign / memalign / aligned_alloc (malloc_usable_size of
 * each block) and, at exit, writes "COMM PEAK_BYTES HEAP_BYTES" to $DIT_LIVE_PEAK_DIR/PID: the
 * largest total held at once (the allocations the run caused, without the allocator's own
 * fragmentation) and glibc's heap size (mallinfo2().arena: with tuneHostAllocator's settings,
 * nothing trimmed, its high-water mark). A program may also ask it directly (weak symbols):
 * dit_live_peak_reset() starts a new peak at what is held now, dit_live_peak_bytes() returns the
 * peak since then, dit_live_bytes() what is held now (ditstudio-vae-bench does, around a decode).
 * Build: cc -O2 -shared -fPIC -o memory_live_peak.so THIS. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void* __libc_malloc(size_t);
extern void __libc_free(void*);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void* __libc_memalign(size_t, size_t);

static atomic_long live, peak;

static void held(long d) {
  long v = atomic_fetch_add(&live, d) + d;
  long p = atomic_load(&peak);
  while (v > p && !atomic_compare_exchange_weak(&peak, &p, v)) {
  }
}

void* malloc(size_t n) {
  void* p = __libc_malloc(n);
  if (p) held((long)malloc_usable_size(p));
  return p;
}
void free(void* p) {
  if (p) held(-(long)malloc_usable_size(p));
  __libc_free(p);
}
void* calloc(size_t a, size_t b) {
  void* p = __libc_calloc(a, b);
  if (p) held((long)malloc_usable_size(p));
  return p;
}
void* realloc(void* q, size_t n) {
  long old = q ? (long)malloc_usable_size(q) : 0;
  void* p = __libc_realloc(q, n);
  if (p) {
    held(-old);
    held((long)malloc_usable_size(p));
  } else if (n == 0) {
    held(-old);
  }
  return p;
}
void* memalign(size_t a, size_t n) {
  void* p = __libc_memalign(a, n);
  if (p) held((long)malloc_usable_size(p));
  return p;
}
int posix_memalign(void** r, size_t a, size_t n) {
  void* p = memalign(a, n);
  if (!p) return 12; /* ENOMEM */
  *r = p;
  return 0;
}
void* aligned_alloc(size_t a, size_t n) { return memalign(a, n); }

void dit_live_peak_reset(void) { atomic_store(&peak, atomic_load(&live)); }
long dit_live_peak_bytes(void) { return atomic_load(&peak); }
long dit_live_bytes(void) { return atomic_load(&live); }

__attribute__((destructor)) static void report(void) {
  const char* dir = getenv("DIT_LIVE_PEAK_DIR");
  if (!dir) return;
  char path[4096], comm[64] = "?";
  FILE* c = fopen("/proc/self/comm", "r");
  if (c) {
    if (fgets(comm, sizeof comm, c)) comm[strcspn(comm, "\n")] = 0;
    fclose(c);
  }
  snprintf(path, sizeof path, "%s/%d", dir, (int)getpid());
  FILE* f = fopen(path, "w");
  if (!f) return;
  struct mallinfo2 mi = mallinfo2();
  fprintf(f, "%s %ld %zu\n", comm, (long)atomic_load(&peak), mi.arena);
  fclose(f);
}
