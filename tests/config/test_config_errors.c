/* Every bad config under the given folder must be refused with exactly the
 * messages its "# expect:" lines give and no others ("# problems: N").
 * {file} stands for the config's path, {dir} for its folder. The files run
 * from a scratch folder that also holds the TLS files they name. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "fileio.h"

#define MAX_EXPECT 16

static char scratch[] = "/tmp/gg-config-errors-XXXXXX";

static void replace(char *out, size_t size, const char *in, const char *file, const char *dir)
{
	size_t n = 0;

	while (*in && n + 1 < size) {
		const char *sub = !strncmp(in, "{file}", 6) ? file : !strncmp(in, "{dir}", 5) ? dir : NULL;
		if (sub) {
			n += (size_t)snprintf(out + n, size - n, "%s", sub);
			in += in[1] == 'f' ? 6 : 5;
		} else {
			out[n++] = *in++;
		}
	}
	out[n < size ? n : size - 1] = '\0';
}

static int write_file(const char *dir, const char *name, const char *text, mode_t mode)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
	if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text) || fchmod(fd, mode)) {
		perror(path);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return close(fd);
}

/* Returns 1 when the case holds, 0 when not (reasons printed). */
static int run_case(const char *src_dir, const char *name)
{
	char src[512], dst[512], want[MAX_EXPECT][512];
	char *text;
	size_t len, nwant = 0;
	long problems = -1;
	int ok = 1;

	snprintf(src, sizeof(src), "%s/%s", src_dir, name);
	snprintf(dst, sizeof(dst), "%s/%s", scratch, name);
	if (gg_read_small_file(src, 1 << 20, &text, &len)) {
		printf("FAIL %s: cannot read it\n", name);
		return 0;
	}
	for (char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
		size_t l = strcspn(line, "\n");
		char buf[512];
		snprintf(buf, sizeof(buf), "%.*s", (int)l, line);
		if (!strncmp(buf, "# expect: ", 10) && nwant < MAX_EXPECT)
			replace(want[nwant++], sizeof(want[0]), buf + 10, dst, scratch);
		else if (!strncmp(buf, "# problems: ", 12))
			problems = strtol(buf + 12, NULL, 10);
	}
	if (nwant == 0 || problems < 0) {
		printf("FAIL %s: no '# expect:' or '# problems:' line\n", name);
		free(text);
		return 0;
	}
	if (write_file(scratch, name, text, 0644)) {
		free(text);
		return 0;
	}
	free(text);

	struct gg_config cfg;
	struct gg_diag diag = { 0 };
	int rc = gg_config_load(dst, &cfg, &diag);
	if (rc != -EINVAL) {
		printf("FAIL %s: load returned %d, expected -EINVAL\n", name, rc);
		ok = 0;
		if (rc == 0)
			gg_config_free(&cfg);
	}
	for (size_t i = 0; i < nwant; i++) {
		size_t k;
		for (k = 0; k < diag.count; k++)
			if (!strcmp(diag.lines[k], want[i]))
				break;
		if (k == diag.count) {
			printf("FAIL %s: missing message\n  want: %s\n", name, want[i]);
			ok = 0;
		}
	}
	for (size_t k = 0; k < diag.count; k++) {
		for (const char *c = diag.lines[k]; *c; c++) {
			if ((unsigned char)*c < 0x20 || *c == 0x7f) {
				printf("FAIL %s: problem %zu holds control character 0x%02x\n", name, k + 1,
				       (unsigned char)*c);
				ok = 0;
				break;
			}
		}
	}
	if ((long)diag.count != problems) {
		printf("FAIL %s: %zu problems reported, expected %ld\n", name, diag.count, problems);
		ok = 0;
	}
	if (!ok)
		for (size_t k = 0; k < diag.count; k++)
			printf("  got:  %s\n", diag.lines[k]);
	gg_diag_free(&diag);
	unlink(dst);
	return ok;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
	char *names[256];
	size_t count = 0, passed = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: %s BAD_CONFIG_DIR\n", argv[0]);
		return 2;
	}
	DIR *d = opendir(argv[1]);
	if (!d || !mkdtemp(scratch)) {
		perror(d ? "mkdtemp" : argv[1]);
		return 1;
	}
	for (struct dirent *e; (e = readdir(d)) && count < 256;) {
		size_t n = strlen(e->d_name);
		if (n > 5 && !strcmp(e->d_name + n - 5, ".toml"))
			names[count++] = strdup(e->d_name);
	}
	closedir(d);
	qsort(names, count, sizeof(*names), by_name);

	if (write_file(scratch, "ca.pem", "not parsed by the config loader\n", 0644) ||
	    write_file(scratch, "cert.pem", "not parsed by the config loader\n", 0644) ||
	    write_file(scratch, "key.pem", "not parsed by the config loader\n", 0600) ||
	    write_file(scratch, "key-open.pem", "not parsed by the config loader\n", 0644) ||
	    write_file(scratch, "key-group-writable.pem", "not parsed by the config loader\n", 0620) ||
	    write_file(scratch, "ca-writable.pem", "not parsed by the config loader\n", 0664))
		return 1;
	for (size_t i = 0; i < count; i++) {
		passed += (size_t)run_case(argv[1], names[i]);
		free(names[i]);
	}
	const char *files[] = { "ca.pem", "cert.pem", "key.pem", "key-open.pem", "key-group-writable.pem",
				"ca-writable.pem" };
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char path[512];
		snprintf(path, sizeof(path), "%s/%s", scratch, files[i]);
		unlink(path);
	}
	rmdir(scratch);
	printf("config errors: %zu passed, %zu failed\n", passed, count - passed);
	return count >= 20 && passed == count ? 0 : 1;
}
