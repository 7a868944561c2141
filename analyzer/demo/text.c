/* libtext.so: string scanning for the mslprof demo; calls back into the program, and two functions
   call each other (a cycle). */
#include <string.h>

long demo_score_word(const char *word, int len);

static const char sample[] =
    "the quick brown fox jumps over the lazy dog while the profiler counts every call "
    "in every module and samples where the time goes";

static int next_word(const char *s, int from, int *len) {
    while (s[from] == ' ') from++;
    int start = from;
    while (s[from] && s[from] != ' ') from++;
    *len = from - start;
    return start;
}

long text_count_words(int rounds) {
    long score = 0;
    for (int r = 0; r < rounds * 200; r++) {
        int pos = 0, len = 0;
        while (sample[pos]) {
            int start = next_word(sample, pos, &len);
            if (len == 0) break;
            score += demo_score_word(sample + start, len);
            pos = start + len;
        }
    }
    return score;
}

int text_odd(int n);
int text_even(int n) { return n == 0 ? 1 : text_odd(n - 1); }
int text_odd(int n) { return n == 0 ? 0 : text_even(n - 1); }
int text_bad_recursion(int depth) { return text_even(depth) + depth; }
