/* mslprof demo program: spends its time in two -pg shared libraries and in itself.
   libshapes.so (about half the time) computes areas; libtext.so (about a third) scans text and calls
   back into the program; the program keeps the rest for itself. */
#include <stdio.h>

double shapes_total_area(int n);
long text_count_words(int rounds);
int text_bad_recursion(int depth);

/* Called back from libtext.so for every word. */
long demo_score_word(const char *word, int len) {
    long s = 0;
    for (int i = 0; i < len; i++) s = s * 31 + word[i];
    return s & 0xff;
}

static long own_work(int n) {
    long acc = 0;
    for (int i = 0; i < n; i++) acc += (i * 2654435761u) >> 7 & 0xff;
    return acc;
}

int main(void) {
    double area = 0;
    long words = 0, own = 0;
    for (int round = 0; round < 200; round++) {
        area += shapes_total_area(60000);
        words += text_count_words(12);
        own += own_work(1500000);
    }
    int depth = text_bad_recursion(20);
    printf("area %.1f, words %ld, own %ld, depth %d\n", area, words, own, depth);
    return 0;
}
