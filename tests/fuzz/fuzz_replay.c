/* Runs a libFuzzer target over saved inputs without libFuzzer, so corpora
 * can be replayed as ordinary (sanitized) tests. Each argument is a file or
 * a directory whose regular files are read (not its subdirectories). */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
	LLVMFuzzerTestOneInput(exact, len);
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

	for (int i = 1; i < argc; i++)
		failed |= replay_path(argv[i], 8, &count);
	printf("replayed %lu inputs\n", count);
	return failed;
}
