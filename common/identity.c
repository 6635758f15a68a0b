/* identity.h: the syntax of a site identity. */
#include "identity.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>

static bool dns_label_char(char c)
{
	return isalnum((unsigned char)c) || c == '-';
}

static int check_dns(const char *s, const char **why)
{
	size_t len = strlen(s);

	if (len == 0 || len > 253) {
		*why = "a DNS name has 1 to 253 characters";
		return -EINVAL;
	}
	for (const char *label = s;;) {
		size_t n = 0;
		while (label[n] && label[n] != '.') {
			if (label[n] == '*') {
				*why = "wildcards are not site identities";
				return -EINVAL;
			}
			if (!dns_label_char(label[n])) {
				*why = "a DNS name holds only letters, digits, '-' and '.'";
				return -EINVAL;
			}
			n++;
		}
		if (n == 0 || n > 63) {
			*why = "each DNS label has 1 to 63 characters (no empty label, no trailing dot)";
			return -EINVAL;
		}
		if (label[0] == '-' || label[n - 1] == '-') {
			*why = "a DNS label neither starts nor ends with '-'";
			return -EINVAL;
		}
		if (!label[n])
			return 0;
		label += n + 1;
	}
}

static int check_uri(const char *s, const char **why)
{
	const char *colon = strchr(s, ':');

	if (!colon || colon == s || !isalpha((unsigned char)s[0])) {
		*why = "a URI starts with a scheme, as in uri:spiffe://gradgate/site-b";
		return -EINVAL;
	}
	for (const char *p = s; p < colon; p++)
		if (!isalnum((unsigned char)*p) && *p != '+' && *p != '-' && *p != '.') {
			*why = "a URI scheme holds only letters, digits, '+', '-' and '.'";
			return -EINVAL;
		}
	if (!colon[1]) {
		*why = "the URI is empty after its scheme";
		return -EINVAL;
	}
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		if (*p <= ' ' || *p >= 0x7f) {
			*why = "a URI holds no spaces, control or non-ASCII bytes";
			return -EINVAL;
		}
	if (strlen(s) > 255) {
		*why = "the identity is longer than 255 characters";
		return -EINVAL;
	}
	return 0;
}

int gg_identity_check(const char *text, const char **why)
{
	if (!strncmp(text, "dns:", 4))
		return check_dns(text + 4, why);
	if (!strncmp(text, "uri:", 4))
		return check_uri(text + 4, why);
	*why = "an identity is \"dns:NAME\" or \"uri:URI\"";
	return -EINVAL;
}
