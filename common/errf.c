#include <stdarg.h>
#include <stdio.h>

#include "gg_common.h"

int gg_errf(char *err, size_t err_size, int code, const char *fmt, ...)
{
	va_list ap;

	if (err && err_size) {
		va_start(ap, fmt);
		vsnprintf(err, err_size, fmt, ap);
		va_end(ap);
	}
	return code;
}
