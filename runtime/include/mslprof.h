/* mslprof.h: ask libmslprof.so for a profile while the program runs.
 *
 * Link with -lmslprof (the runtime linked in), or run under LD_PRELOAD=libmslprof.so and define
 * MSLPROF_WEAK before including this header: the functions are then weak, and null when the program
 * runs without the runtime (test `if (mslprof_dump)` before calling it). See runtime/README.md. */
#ifndef MSLPROF_H
#define MSLPROF_H

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

#ifdef __cplusplus
}
#endif

#endif /* MSLPROF_H */
