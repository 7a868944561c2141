/* mslprof.h: ask libmslprof.so for a profile while the program runs.
 *
 * Link with -lmslprof (the runtime linked in), or run under LD_PRELOAD=libmslprof.so and define
 * MSLPROF_WEAK before including this header: the functions are then weak, and null when the program
 * runs without the runtime (test `if (mslprof_dump)` before calling it). See runtime/README.md. */
#ifndef MSLPROF_H
#define MSLPROF_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef MSLPROF_WEAK
#define MSLPROF_API __attribute__((weak))
#else
#define MSLPROF_API
#endif

/* Writes the profile collected so far to PATH, or, when PATH is NULL, to the usual profile path
 * (gmon.out, GPROFDIR/PID.prog or GMON_OUT_PREFIX.PID) with ".N" appended, N = 1, 2, ...
 * Counting goes on; every snapshot holds everything since the start. The file appears whole (it is
 * written under a temporary name, then renamed). Returns 0, or -1 with errno set: ENOTSUP when
 * profiling is not active, else the error of creating or writing the file.
 * Not async-signal-safe: use MSLPROF_DUMP_SIGNAL to dump from a signal. */
MSLPROF_API int mslprof_dump(const char *path);

/* 0 pauses profiling (call counting and sampling); any other value resumes it. */
MSLPROF_API void moncontrol(int mode);

/* Bucket widths for smonitor (the values of glibc's <sys/profil.h>). */
#ifndef PROF_USHORT
#define PROF_USHORT 0 /* 16-bit buckets */
#endif
#ifndef PROF_UINT
#define PROF_UINT 1 /* 32-bit buckets */
#endif

/* A range of code, [low_pc, high_pc): any addresses of the process, in one module or spanning several.
 * (MSLP's paper does not list the fields of its struct text_region; these are mslprof's.) */
struct text_region {
    const void *low_pc;
    const void *high_pc;
};

/* MSLP's smonitor (paper, 2.2.2). If an earlier call is collecting, writes the profile collected so far
 * as mslprof_dump(NULL) does and stops that collection. Then, unless regions is NULL or nregions is 0,
 * every sample whose PC lies in one of the nregions regions (at most 64; the first that holds it counts)
 * is also added, on top of the runtime's own histograms, to buffer, an array of bufsize / 2 (PROF_USHORT)
 * or bufsize / 4 (PROF_UINT) buckets aligned to their width; counts saturate.
 * The buffer is not initialised: counts add to what it holds. All regions share one granularity G, the
 * smallest number of bytes per bucket with which every region's ceil(size / G) buckets fit in the
 * buffer; region i's buckets follow region i-1's, and a PC maps to first_bucket(i) + (pc - low_pc) / G.
 * nfunc is unused. Samples are taken only while profiling is active (the runtime loaded, not paused by
 * moncontrol(0)). The buffer must stay valid until the next call (smonitor(NULL, 0, NULL, 0, 0, 0)
 * stops). Bad arguments: one stderr line, nothing collected. */
MSLPROF_API void smonitor(struct text_region *regions, int nregions, void *buffer,
                          size_t bufsize, int nfunc, unsigned flags);

#ifdef __cplusplus
}
#endif

#endif /* MSLPROF_H */
