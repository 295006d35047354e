// Counts heap allocations for pppbridge-bench: the executable defines malloc, calloc, realloc,
// posix_memalign, aligned_alloc and memalign, so every allocation in the process (the Swift
// runtime's included) comes here first and goes on to glibc's allocator (its __libc_ entry
// points). Frees are not counted: the figure is allocations per megabyte moved.
#include <stddef.h>
#include <stdatomic.h>
#include <errno.h>
#include "allocation_counter.h"

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *pointer, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);

static _Atomic unsigned long long total;
static _Thread_local unsigned long long mine;

static inline void counted(void) {
    mine++;
    atomic_fetch_add_explicit(&total, 1, memory_order_relaxed);
}

void *malloc(size_t size) {
    counted();
    return __libc_malloc(size);
}

void *calloc(size_t count, size_t size) {
    counted();
    return __libc_calloc(count, size);
}

void *realloc(void *pointer, size_t size) {
    counted();
    return __libc_realloc(pointer, size);
}

void *memalign(size_t alignment, size_t size) {
    counted();
    return __libc_memalign(alignment, size);
}

void *aligned_alloc(size_t alignment, size_t size) {
    counted();
    return __libc_memalign(alignment, size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0) return EINVAL;
    counted();
    void *p = __libc_memalign(alignment, size);
    if (p == NULL && size != 0) return ENOMEM;
    *out = p;
    return 0;
}

unsigned long long allocation_counter_thread(void) { return mine; }

unsigned long long allocation_counter_total(void) {
    return atomic_load_explicit(&total, memory_order_relaxed);
}
