/* GG_CODEC_ISA with a value that names no instruction set is not taken
 * silently: the gateway warns, naming the value, and uses the best kernels
 * the CPU has. (Kernels are picked once per process, hence a test of its
 * own.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec.h"
#include "test_util.h"

int main(void)
{
	int fds[2], saved = dup(2);
	char buf[1024] = "";

	CHECK(pipe(fds) == 0 && saved >= 0, "pipe");
	CHECK(setenv("GG_CODEC_ISA", "avx-512", 1) == 0, "setenv");
	fflush(stderr);
	dup2(fds[1], 2);
	enum gg_isa isa = gg_codec_isa();
	fflush(stderr);
	dup2(saved, 2);
	close(fds[1]);
	ssize_t n = read(fds[0], buf, sizeof(buf) - 1);
	buf[n > 0 ? n : 0] = '\0';
	CHECK(strstr(buf, "event=codec_isa_ignored variable=GG_CODEC_ISA value=\"avx-512\"") != NULL,
	      "no warning for GG_CODEC_ISA=avx-512: '%s'", buf);
	enum gg_isa best = GG_ISA_SCALAR;
	for (int i = 0; i < GG_ISA_COUNT; i++)
		if (gg_isa_available((enum gg_isa)i))
			best = (enum gg_isa)i;
	CHECK(isa == best, "GG_CODEC_ISA=avx-512 picked %s, the best here is %s", gg_isa_name(isa), gg_isa_name(best));
	printf("codec isa env: an unknown value warns and keeps %s\n", gg_isa_name(isa));
	return 0;
}
