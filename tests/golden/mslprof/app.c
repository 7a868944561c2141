/* The golden report's program (-pg): calls into libcore.so (linked), which calls back into it, and
 * loads libplugin.so twice with dlopen, running it and closing it each time. main is in start.c. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

long core_work(long n);
long core_parity(int n);

static volatile long sink;

/* Called back from libcore.so. */
__attribute__((noinline)) long app_callback(long v) {
    long s = 0;
    for (long i = 0; i < 20000; i++) s += (v ^ i) & 7;
    sink += s;
    return s;
}

/* Time of the program's own. */
__attribute__((noinline)) static long own_work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += (i * 2654435761u) >> 7 & 0xff;
    return s;
}

/* Time in libc.so.6, which the run does not profile: the report lists it with its share. */
char buffer[1 << 22];
__attribute__((noinline)) static long libc_work(int n) {
    for (int i = 0; i < n; i++) memset(buffer, i, sizeof buffer);
    return buffer[n % sizeof buffer];
}

static int run_plugin(long n) {
    void *h = dlopen("./libplugin.so", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    long (*run)(long) = (long (*)(long))dlsym(h, "plugin_run");
    if (!run) return 1;
    sink += run(n);
    return dlclose(h);
}

int app_main(void) {
    for (int round = 0; round < 20; round++) {
        sink += core_work(400);
        sink += own_work(10000000);
        sink += libc_work(10);
    }
    sink += core_parity(9);
    if (run_plugin(300) || run_plugin(300)) return 1;
    printf("done\n");
    return 0;
}
