/*
 * attune.h - Attune tiered memory for HPC workflows: the C API.
 *
 * Two levels:
 *   allocate_TM / free_TM       IMME Table I: memory placed by what the workflow needs.
 *   attune_*                    the full API: options, pinning, prefetch, statistics.
 *
 * Errors: functions returning int give 0 on success and -1 with errno set on failure;
 * functions returning a pointer give NULL with errno set. attune_last_error() returns a
 * readable message for the calling thread. The library never aborts the application.
 *
 * Memory from Attune may be absent from DRAM at any moment (it lives in a slower tier
 * until touched). Touching it is always correct. Under fault_mode=signal, a system call
 * that reads or writes a non-resident managed page fails with EFAULT: pin or prefetch
 * such buffers first, or use the default fault_mode=thread (see docs/design.md).
 *
 * fork(): managed memory is not inherited (MADV_DONTFORK); a child that touches it gets
 * SIGSEGV. exec() is unaffected. Use attune_* only in the process that allocated.
 */
#ifndef ATTUNE_H
#define ATTUNE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTUNE_VERSION_MAJOR 0
#define ATTUNE_VERSION_MINOR 1

/* Placement flags, combinable. 0 lets the runtime decide. */
#define ATTUNE_LAT 0x1 /* latency-sensitive: fastest tier, part pinned and pre-faulted */
#define ATTUNE_BW  0x2 /* bandwidth-intensive: spread over tiers by bandwidth */
#define ATTUNE_CAP 0x4 /* capacity: straight to the big tier */
#define ATTUNE_SHL 0x8 /* short-lived: fast tier, protected while it lives */

/* IMME Table I. */
void *allocate_TM(size_t size, int flags);
void free_TM(void *ptr);

/* Fault delivery of one allocation (attune_alloc_opts.fault_mode). */
#define ATTUNE_FAULT_DEFAULT 0 /* the configured fault_mode */
#define ATTUNE_FAULT_THREAD  1 /* a handler thread resolves faults; system calls work */
#define ATTUNE_FAULT_SIGNAL  2 /* the faulting thread resolves its own fault (faster) */

typedef struct attune_alloc_opts {
    size_t struct_size;   /* set by attune_alloc_opts_init */
    int flags;            /* ATTUNE_LAT | ... */
    int preferred_tier;   /* -1: runtime decides; else a tier index >= 1 from attune_tier_stats */
    int64_t pin_bytes;    /* -1: default by flags (pin_fraction for LAT/SHL); else bytes to pin */
    int prefault;         /* non-zero: place the whole region in DRAM now (within the budget) */
    size_t chunk_size;    /* 0: configured default; else a power of two from 4096 to 2 MiB */
    int fault_mode;       /* ATTUNE_FAULT_* */
} attune_alloc_opts;

/* Fills opts with defaults. Call before setting fields. */
void attune_alloc_opts_init(attune_alloc_opts *opts);

/* Starts the runtime with a TOML configuration file (NULL: ATTUNE_CONFIG, environment,
 * embedded default). Optional: the first allocation starts the runtime too. Returns -1
 * with errno EINVAL and a message naming the key and line for a broken configuration. */
int attune_init(const char *config_path);

void *attune_alloc(size_t size, const attune_alloc_opts *opts);
int attune_free(void *ptr);

/* Changes the flags of an allocation (from attune_alloc/allocate_TM of 1 MiB or more). */
int attune_set_flags(void *ptr, int flags);

/* Pin: make resident and never evict. ENOMEM if the pinned total would exceed DRAM. */
int attune_pin(void *ptr, size_t len);
int attune_unpin(void *ptr, size_t len);
/* Bring a range into DRAM now. */
int attune_prefetch(void *ptr, size_t len);
/* Drop the content of a page-aligned range of an allocation: it reads as zero afterwards
 * and its DRAM and far-tier space are freed. Use it where plain memory would take
 * madvise(MADV_DONTNEED): on managed memory, madvise cannot reach pages held in a far
 * tier (their old content would come back). EINVAL for an unaligned or foreign range. */
int attune_discard(void *ptr, size_t len);

#define ATTUNE_MAX_TIERS 16

typedef struct attune_region_stats {
    uint64_t size;             /* bytes requested (a small block: its usable size, at least the request) */
    uint64_t chunk_size;
    uint32_t flags;
    uint32_t ntiers;           /* valid entries in tier_bytes */
    uint64_t resident_bytes;   /* in DRAM (= tier_bytes[0]) */
    uint64_t tier_bytes[ATTUNE_MAX_TIERS]; /* per tier, same order as attune_tier_stats */
    uint64_t pinned_bytes;
    uint64_t faults;
    uint64_t evictions;        /* chunks */
    uint64_t fetched_bytes;    /* brought back from far tiers */
    uint64_t evicted_bytes;
    uint64_t zero_fills;       /* first-touch chunks */
    uint64_t readahead_chunks;
    uint64_t clean_skips;      /* evictions that needed no write (content already in the tier) */
    uint64_t heat;             /* sum of per-chunk access counters */
} attune_region_stats_t;

/* For a small allocation the statistics are those of its shared class arena. */
int attune_region_stats(const void *ptr, attune_region_stats_t *out);

typedef struct attune_tier_stats {
    char name[32];
    char kind[16];          /* dram, memory, file, numa */
    uint64_t capacity;
    uint64_t used_bytes;    /* dram: resident managed bytes; far: bytes stored */
    uint64_t latency_ns;
    uint64_t bandwidth;     /* bytes/s, declared */
    uint64_t faults;        /* dram: faults resolved; far: loads */
    uint64_t evictions;     /* dram: chunks evicted; far: stores */
    uint64_t bytes_in;
    uint64_t bytes_out;
    uint64_t errors;        /* dram: budget overruns; far: I/O errors and full events */
} attune_tier_stats_t;

int attune_tier_count(void);
int attune_tier_stats(int index, attune_tier_stats_t *out);
/* JSON of all tiers' statistics into buf (NUL-terminated); returns the full length.
 * {"tiers": [per tier as attune_tier_stats], "engine": {faults, evictions, evicted_bytes,
 * fetched_bytes, direct_reclaims (faults that evicted before placing their chunk),
 * evictor_evicted_bytes (the background evictor's part of evicted_bytes),
 * dropped_behind_bytes (evicted from just behind streamed BW regions),
 * budget_overruns, protected_skips (chunks left in DRAM because the program made them
 * read-only or inaccessible with mprotect), unplaced_runs (runs claimed for eviction that
 * no far tier took: all full or failing)} or null without tiering, "numa": {"tiers": [name, nodes, capacity,
 * used_bytes], "interleave", "write_heat", "counters": {promoted_bytes,
 * demoted_cold_bytes, demoted_headroom_bytes, moved_pages, ...}} or null without a
 * numa tier}. See docs/run-report.md for every field. */
int attune_stats_json(char *buf, size_t len);

/* Phases for `attune profile`: each phase gets its own access curve. Phases do not nest
 * (a begin ends the open phase). 0, or -1 with errno EINVAL (no name; end with none open).
 * A program run under `attune profile` without linking libattune can declare them
 * __attribute__((weak)) and call them when they are non-NULL (the profiler provides them). */
int attune_phase_begin(const char *name);
int attune_phase_end(void);

/* Shared regions, kept by the node daemon (attuned): one region mapped into several
 * processes, possibly of different workflows and users. The first open creates it with
 * `size` bytes (zero-filled); later opens pass the same size, or 0 to open an existing one
 * only. Reference counted: it lives until the last process holding it closes it or exits.
 * Another user's region opens only after its owner calls attune_shared_grant.
 * NULL with errno: ENOTCONN (no daemon), EACCES (not granted), ENOENT (size 0 and none),
 * EINVAL (bad name: 1-64 of A-Z a-z 0-9 . _ -, or another size), ENOMEM (shared_max),
 * EAGAIN (an input still being staged). A staged input (`attune stage NAME FILE`, opened
 * with size 0) is sealed read-only: it maps read-only and a store into it is a SIGSEGV. */
void *attune_shared_open(const char *name, size_t size, int flags);
int attune_shared_close(void *ptr);
int attune_shared_grant(const char *name, uint32_t uid);
/* 1 when this process is registered with attuned now, else 0. */
int attune_daemon_connected(void);

const char *attune_last_error(void);
const char *attune_strerror(int err);

#ifdef __cplusplus
}
#endif

#endif /* ATTUNE_H */
