/* What the script-driven fuzz targets share besides their scripts. */
#ifndef GG_FUZZ_CHECK_H
#define GG_FUZZ_CHECK_H

/* A broken promise: says which and aborts, which libFuzzer and the replay
 * report with the input. */
_Noreturn void fuzz_fail(const char *target, const char *what);

/* File descriptors this process has open, to tell that a run leaked none. */
unsigned fuzz_open_fds(void);

#endif
