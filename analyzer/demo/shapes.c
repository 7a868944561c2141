/* libshapes.so: floating-point work for the mslprof demo. */
#include <math.h>

static double circle(double r) { return M_PI * r * r; }
static double polygon(int sides, double r) {
    double a = 0;
    for (int i = 0; i < sides; i++) a += 0.5 * r * r * sin(2 * M_PI / sides);
    return a;
}

double shapes_total_area(int n) {
    double total = 0;
    for (int i = 0; i < n; i++) {
        double r = (i % 97) / 10.0;
        total += circle(r) + polygon(3 + i % 5, r);
    }
    return total;
}
