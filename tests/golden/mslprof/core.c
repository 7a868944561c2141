/* libcore.so (-pg), linked to the program: calls back into it, has a cycle, and defines a `work` that
 * libplugin.so defines too. */
long app_callback(long v);

static volatile long sink;

__attribute__((noinline)) long work(long v) {
    long s = 0;
    for (long i = 0; i < 40000; i++) s += (v * i) % 13;
    return s;
}

__attribute__((noinline)) long core_step(long v) { return work(v) + 1; }

long core_work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) {
        s += core_step(i);
        if (i % 4 == 0) s += app_callback(i);
    }
    return s;
}

long core_odd(int n);
__attribute__((noinline)) long core_even(int n) { return n == 0 ? 1 : core_odd(n - 1); }
__attribute__((noinline)) long core_odd(int n) { return n == 0 ? 0 : core_even(n - 1); }
long core_parity(int n) { sink++; return core_even(n); }
