/* Not built with -pg: main only calls app_main, so no arc names a caller inside libc. */
int app_main(void);
int main(void) { return app_main(); }
