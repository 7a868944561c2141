/* libplugin.so (-pg), loaded with dlopen and closed again: its own `work` (a name libcore.so has too), and
 * calls into libcore.so. */
long core_step(long v);

__attribute__((noinline)) static long work(long v) {
    long s = 0;
    for (long i = 0; i < 60000; i++) s += (v + i) % 11;
    return s;
}

long plugin_run(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) {
        s += work(i);
        if (i % 10 == 0) s += core_step(i);
    }
    return s;
}
