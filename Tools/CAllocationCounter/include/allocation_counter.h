#ifndef ALLOCATION_COUNTER_H
#define ALLOCATION_COUNTER_H

/* The benchmark's allocation counter: this target defines malloc and its siblings, which the
   executable's symbols take over from the C library's, counting each call per thread before
   handing it to the C library's own allocator. */

/* Allocations (malloc, calloc, realloc, posix_memalign, aligned_alloc, memalign) made by the
   calling thread so far. */
unsigned long long allocation_counter_thread(void);

/* Allocations made by every thread so far. */
unsigned long long allocation_counter_total(void);

#endif
