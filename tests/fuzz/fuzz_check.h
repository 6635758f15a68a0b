/* What the script-driven fuzz targets share besides their scripts. */
#ifndef GG_FUZZ_CHECK_H
#define GG_FUZZ_CHECK_H

#include <stddef.h>

/* A broken promise: says which and aborts, which libFuzzer and the replay
 * report with the input. */
_Noreturn void fuzz_fail(const char *target, const char *what);

/* File descriptors this process has open, to tell that a run leaked none. */
unsigned fuzz_open_fds(void);

/* Sends one packet on the Unix socket fd, without waiting, with up to
 * FUZZ_MAX_PASSED_FDS descriptors (SCM_RIGHTS); a full or closed socket
 * drops it, as a real peer would see. Returns sendmsg's result. */
#define FUZZ_MAX_PASSED_FDS 2
long fuzz_send_fds(int fd, const void *msg, size_t len, const int *fds, unsigned nfds);

#endif
