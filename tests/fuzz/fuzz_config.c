/* libFuzzer target for the config loader (config/config.c) on any bytes,
 * without the checks of the files a config names: every refusal has its
 * problems, each one printable line that names the file; an accepted
 * config prints (as --check-config does) as TOML that loads back and
 * prints the same again. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SOURCE "fuzz.toml"
#define BASE_DIR "/nonexistent-gradgate-fuzz"

static void check_diag(int rc, const struct gg_diag *diag)
{
	if (rc && rc != -EINVAL && rc != -ENOMEM)
		abort();
	/* Out of memory, a problem may have gone unsaid. */
	if ((rc == 0) != (diag->count == 0) && rc != -ENOMEM)
		abort();
	for (size_t i = 0; i < diag->count; i++) {
		const char *line = diag->lines[i];
		if (strncmp(line, SOURCE ":", strlen(SOURCE ":")))
			abort();
		for (const char *c = line; *c; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				abort();
	}
}

/* cfg printed into a new string (NULL when out of memory); *len its length. */
static char *printed(const struct gg_config *cfg, size_t *len)
{
	char *text = NULL;
	FILE *f = open_memstream(&text, len);

	if (!f)
		return NULL;
	int rc = gg_config_print(cfg, f);
	if (fclose(f) || rc) {
		free(text);
		return NULL;
	}
	return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gg_config cfg, again;
	struct gg_diag diag = { 0 };
	size_t len, len2;

	int rc = gg_config_load_settings_text((const char *)data, size, SOURCE, BASE_DIR, &cfg, &diag);
	check_diag(rc, &diag);
	gg_diag_free(&diag);
	if (rc)
		return 0;
	char *text = printed(&cfg, &len);
	gg_config_free(&cfg);
	if (!text)
		return 0;
	rc = gg_config_load_settings_text(text, len, SOURCE, BASE_DIR, &again, &diag);
	if (rc && rc != -ENOMEM)
		abort(); /* what --check-config prints does not load back */
	gg_diag_free(&diag);
	if (rc) {
		free(text);
		return 0;
	}
	char *text2 = printed(&again, &len2);
	gg_config_free(&again);
	if (text2 && (len2 != len || memcmp(text, text2, len)))
		abort(); /* it loads back to another configuration */
	free(text);
	free(text2);
	return 0;
}
