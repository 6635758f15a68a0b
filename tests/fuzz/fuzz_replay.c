/* Runs a libFuzzer target over saved inputs without libFuzzer, so corpora
 * can be replayed as ordinary (sanitized) tests. Each argument is a file or
 * a directory whose regular files are read (not its subdirectories).
 *
 * Every input runs once as it is, then again with its first allocation
 * failing, then its second, and so on until a run gets past all of them
 * (fuzz_alloc.h): out-of-memory paths must neither crash nor leak. An
 * allocation is not made to fail again when an earlier run made it from
 * the same code after the same few allocations (KEY_SITES below).
 * --no-alloc-failures leaves those runs out; --fail-alloc=N runs each
 * input once more with allocation N failing only (to look into one). */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Sanitizer runtimes call this just before they end the process. */
void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

static bool alloc_failures = true;
static unsigned long alloc_runs, only_alloc;
/* What runs now, for the last words of a run that dies. */
static char running[512];

static void say_running(void)
{
	if (running[0])
		(void)!write(STDERR_FILENO, running, strlen(running));
}

static void on_fatal_signal(int sig)
{
	say_running();
	signal(sig, SIG_DFL);
	raise(sig);
}

/* An allocation is keyed by its site and the sites of the KEY_SITES - 1
 * allocations before it, hashed. A failure whose key was tried already, for
 * an earlier input, is not tried again: the inputs share their set-up (the
 * same calls in the same order), and failing it once per input would only
 * repeat the same run; past that, what an out-of-memory path unwinds is the
 * work of the few calls before it. Keying by every allocation of the run up
 * to it instead ran the node corpus 2.8 times as often (6800 runs), and
 * reached 2 more lines of the project's code, both of them data paths that
 * differ between runs of the same corpus, not out-of-memory paths. */
#define KEY_SITES 8
#define RECORD_CAP (1ul << 16)
#define SET_CAP (1ul << 20)

static const void *sites[RECORD_CAP];
static uint64_t tried[SET_CAP];
static unsigned long tried_len, alloc_skipped;

/* The key of the n-th allocation of the run (n >= 1). */
static uint64_t alloc_key(unsigned long n)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (unsigned long i = n > KEY_SITES ? n - KEY_SITES : 0; i < n; i++)
		h = (h ^ (uint64_t)(uintptr_t)sites[i]) * 0x100000001b3ull;
	return (h ^ h >> 32) | 1; /* 0 marks an empty slot */
}

/* Whether failing the allocation with this key was tried already; if not,
 * it is now. A full set forgets nothing and dedupes no more. */
static bool tried_before(uint64_t key)
{
	unsigned long i = (unsigned long)(key ^ key >> 21) & (SET_CAP - 1);

	while (tried[i] && tried[i] != key)
		i = (i + 1) & (SET_CAP - 1);
	if (tried[i])
		return true;
	if (tried_len >= SET_CAP / 2)
		return false;
	tried[i] = key;
	tried_len++;
	return false;
}

static void run_input(const char *path, const uint8_t *data, size_t len)
{
	unsigned long total;

	snprintf(running, sizeof(running), "replaying %s\n", path);
	gg_fuzz_alloc_record(sites, RECORD_CAP);
	LLVMFuzzerTestOneInput(data, len);
	total = gg_fuzz_alloc_calls();
	gg_fuzz_alloc_fail_at(0);
	for (unsigned long n = only_alloc ? only_alloc : 1; alloc_failures; n++) {
		if (!only_alloc && n <= total && n <= RECORD_CAP) {
			if (tried_before(alloc_key(n))) {
				alloc_skipped++;
				continue;
			}
		}
		snprintf(running, sizeof(running), "replaying %s with allocation %lu failing\n", path, n);
		gg_fuzz_alloc_fail_at(n);
		LLVMFuzzerTestOneInput(data, len);
		bool hit = gg_fuzz_alloc_failed();
		gg_fuzz_alloc_fail_at(0);
		if (!hit)
			break;
		alloc_runs++;
		if (only_alloc)
			break;
	}
	running[0] = '\0';
}

/* The input gets a buffer of exactly its size, so overreads are caught. */
static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	size_t len = 0, cap = 4096;
	uint8_t *buf = NULL, *exact;

	if (!f) {
		perror(path);
		return -1;
	}
	for (;;) {
		uint8_t *grown = realloc(buf, cap);

		if (!grown)
			goto fail;
		buf = grown;
		len += fread(buf + len, 1, cap - len, f);
		if (len < cap)
			break;
		cap *= 2;
	}
	if (ferror(f))
		goto fail;
	fclose(f);
	exact = malloc(len ? len : 1);
	if (!exact) {
		free(buf);
		return -1;
	}
	memcpy(exact, buf, len);
	free(buf);
	run_input(path, exact, len);
	free(exact);
	return 0;
fail:
	perror(path);
	free(buf);
	fclose(f);
	return -1;
}

static int is_regular(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Replays a file, or every regular file below a directory (at most
 * `depth` levels down). Returns 0 when all could be read. */
static int replay_path(const char *path, int depth, unsigned long *count)
{
	struct stat st;
	struct dirent *de;
	DIR *dir;
	int failed = 0;

	if (stat(path, &st) != 0) {
		perror(path);
		return 1;
	}
	if (!S_ISDIR(st.st_mode)) {
		if (replay_file(path))
			return 1;
		(*count)++;
		return 0;
	}
	if (depth == 0)
		return 0;
	dir = opendir(path);
	if (!dir) {
		perror(path);
		return 1;
	}
	while ((de = readdir(dir))) {
		if (de->d_name[0] == '.')
			continue;
		size_t n = strlen(path) + strlen(de->d_name) + 2;
		char *child = malloc(n);
		if (!child) {
			failed = 1;
			break;
		}
		snprintf(child, n, "%s/%s", path, de->d_name);
		if (is_regular(child) || depth > 1)
			failed |= replay_path(child, depth - 1, count);
		free(child);
	}
	closedir(dir);
	return failed;
}

int main(int argc, char **argv)
{
	unsigned long count = 0;
	int failed = 0;

	/* A sanitizer's own handlers report more than these would; but
	 * AddressSanitizer leaves SIGABRT alone (handle_abort=0), and a
	 * target's broken check aborts. */
	if (__sanitizer_set_death_callback) {
		__sanitizer_set_death_callback(say_running);
	} else {
		signal(SIGSEGV, on_fatal_signal);
		signal(SIGBUS, on_fatal_signal);
	}
	signal(SIGABRT, on_fatal_signal);
	int paths = 0;
	for (int i = 1; i < argc; i++) {
		char *end;
		if (!strcmp(argv[i], "--no-alloc-failures")) {
			alloc_failures = false;
		} else if (!strncmp(argv[i], "--fail-alloc=", 13)) {
			only_alloc = strtoul(argv[i] + 13, &end, 10);
			if (end == argv[i] + 13 || *end || !only_alloc) {
				fprintf(stderr, "%s: --fail-alloc wants an allocation number from 1, not '%s'\n", argv[0],
					argv[i] + 13);
				return 2;
			}
		} else if (argv[i][0] == '-') { /* a file named so is ./-NAME */
			bool help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
			fprintf(help ? stdout : stderr,
				"%s%s%s"
				"usage: %s [--no-alloc-failures | --fail-alloc=N] FILE|DIR...\n"
				"  replays every input once, then with each of its allocations failing in turn;\n"
				"  --no-alloc-failures: once each; --fail-alloc=N: once more with allocation N failing\n",
				help ? "" : "unknown option '", help ? "" : argv[i], help ? "" : "'\n", argv[0]);
			return help ? 0 : 2;
		} else {
			paths++;
		}
	}
	if (!paths) {
		fprintf(stderr, "%s: no input given (FILE or DIR...; --help)\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++)
		if (argv[i][0] != '-')
			failed |= replay_path(argv[i], 8, &count);
	printf("replayed %lu inputs, and %lu times with an allocation failing (%lu left out: an earlier input failed them)\n",
	       count, alloc_runs, alloc_skipped);
	return failed;
}
