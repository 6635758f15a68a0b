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

int main(int argc, char **argv)
{
	unsigned long count = 0;
	int i, failed = 0;

	for (i = 1; i < argc; i++) {
		struct stat st;
		struct dirent *de;
		DIR *dir;

		if (stat(argv[i], &st) != 0) {
			perror(argv[i]);
			failed = 1;
			continue;
		}
		if (!S_ISDIR(st.st_mode)) {
			if (replay_file(argv[i]))
				failed = 1;
			else
				count++;
			continue;
		}
		dir = opendir(argv[i]);
		if (!dir) {
			perror(argv[i]);
			failed = 1;
			continue;
		}
		while ((de = readdir(dir))) {
			size_t n = strlen(argv[i]) + strlen(de->d_name) + 2;
			char *path = malloc(n);

			if (!path) {
				failed = 1;
				break;
			}
			snprintf(path, n, "%s/%s", argv[i], de->d_name);
			if (is_regular(path)) {
				if (replay_file(path))
					failed = 1;
				else
					count++;
			}
			free(path);
		}
		closedir(dir);
	}
	printf("replayed %lu inputs\n", count);
	return failed;
}
