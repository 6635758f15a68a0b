#include "config_check.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>

#include "gg_common.h"
#include "identity.h"

int gg_check_site_name(const char *v, char *why, size_t size)
{
	size_t n = strlen(v);

	if (n == 0 || n > 63)
		return gg_errf(why, size, -EINVAL, "site name \"%s\" must be 1 to 63 characters", v);
	if (v[0] == '-' || v[n - 1] == '-')
		return gg_errf(why, size, -EINVAL, "site name \"%s\" must start and end with a letter or digit", v);
	for (size_t i = 0; i < n; i++)
		if (!((v[i] >= 'a' && v[i] <= 'z') || (v[i] >= '0' && v[i] <= '9') || v[i] == '-'))
			return gg_errf(why, size, -EINVAL, "site name \"%s\" may hold only a-z, 0-9 and '-'", v);
	return 0;
}

/* Whether buf (len bytes, no address) is a host name: dot-separated
 * labels of 1 to 63 letters, digits and '-', none at a label's ends; a
 * final dot allowed. */
static bool host_name_ok(const char *buf, size_t len)
{
	size_t label = 0;

	for (size_t i = 0; i < len; i++) {
		char c = buf[i];
		if (c == '.') {
			if (!label || buf[i - 1] == '-')
				return false;
			label = 0;
			continue;
		}
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-'))
			return false;
		if ((c == '-' && !label) || ++label > 63)
			return false;
	}
	return len && buf[len - 1] != '-';
}

static int check_host(const char *host, size_t len, bool bracketed, char *why, size_t size)
{
	char buf[256];
	unsigned char addr[16];

	if (len == 0)
		return gg_errf(why, size, -EINVAL, "missing host before ':port'");
	if (len >= sizeof(buf))
		return gg_errf(why, size, -EINVAL, "host name is longer than 255 characters");
	memcpy(buf, host, len);
	buf[len] = '\0';
	if (bracketed) {
		if (inet_pton(AF_INET6, buf, addr) != 1)
			return gg_errf(why, size, -EINVAL, "\"[%s]\" is not an IPv6 address", buf);
		return 0;
	}
	if (inet_pton(AF_INET, buf, addr) == 1)
		return 0;
	for (size_t i = 0; i < len; i++) {
		char c = buf[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
		      c == '.'))
			return gg_errf(why, size, -EINVAL, "\"%s\" is neither an IPv4 address nor a host name%s", buf,
				    c == ':' ? " (write IPv6 addresses as [addr]:port)" : "");
	}
	if (!host_name_ok(buf, len))
		return gg_errf(why, size, -EINVAL, "\"%s\" is not a host name: its dot-separated labels must each "
			       "have 1 to 63 letters, digits or '-', and not start or end with '-'", buf);
	return 0;
}

int gg_check_address(const char *v, char *why, size_t size)
{
	const char *colon = strrchr(v, ':');
	const char *host = v;
	size_t host_len;
	bool bracketed = false;

	if (!colon)
		return gg_errf(why, size, -EINVAL, "\"%s\" is not host:port (the port is missing)", v);
	if (v[0] == '[') {
		const char *close = strchr(v, ']');
		if (!close || close + 1 != colon)
			return gg_errf(why, size, -EINVAL, "\"%s\" is not [IPv6]:port", v);
		host = v + 1;
		host_len = (size_t)(close - host);
		bracketed = true;
	} else {
		host_len = (size_t)(colon - v);
	}
	if (check_host(host, host_len, bracketed, why, size))
		return -EINVAL;
	const char *port = colon + 1;
	char *end;
	errno = 0;
	long p = strtol(port, &end, 10);
	if (!*port || *end || errno || port[0] < '0' || port[0] > '9')
		return gg_errf(why, size, -EINVAL, "port \"%s\" is not a number", port);
	if (p < 1 || p > 65535)
		return gg_errf(why, size, -EINVAL, "port %ld is out of range (1-65535)", p);
	/* The resolver takes ports as written, and a dial would fail on each try. */
	if (port[0] == '0')
		return gg_errf(why, size, -EINVAL, "port \"%s\" has a leading zero; write it as %ld", port, p);
	return 0;
}

/* The host of valid "host:port" v into host (without brackets), and its
 * port. */
static void split_address(const char *v, char *host, size_t size, long *port)
{
	const char *colon = strrchr(v, ':');
	size_t len = (size_t)(colon - v);

	if (v[0] == '[') {
		v++;
		len = len >= 2 ? len - 2 : 0;
	}
	snprintf(host, size, "%.*s", (int)GG_MIN(len, size), v);
	*port = strtol(colon + 1, NULL, 10);
}

static const unsigned char v4_mapped[12] = { [10] = 0xff, [11] = 0xff };

/* host's addresses as IPv6 (IPv4 mapped) into out[2]; how many (0: a
 * name other than localhost). *any: 4 for 0.0.0.0, which holds the IPv4
 * addresses, 6 for [::], which holds both families; else 0. */
static unsigned host_addresses(const char *host, unsigned char out[2][16], int *any)
{
	static const unsigned char zero[16];
	unsigned char v4[4];

	*any = 0;
	if (!strcasecmp(host, "localhost")) {
		memcpy(out[0], v4_mapped, 12);
		memcpy(out[0] + 12, (const unsigned char[]){ 127, 0, 0, 1 }, 4);
		memset(out[1], 0, 16);
		out[1][15] = 1;
		return 2;
	}
	if (inet_pton(AF_INET, host, v4) == 1) {
		memcpy(out[0], v4_mapped, 12);
		memcpy(out[0] + 12, v4, 4);
		*any = memcmp(v4, zero, 4) ? 0 : 4;
		return 1;
	}
	if (inet_pton(AF_INET6, host, out[0]) == 1) {
		*any = memcmp(out[0], zero, 16) ? 0 : 6;
		return 1;
	}
	return 0;
}

/* Whether a wildcard of family `any` holds address a (IPv6 form). */
static bool held_by(int any, const unsigned char a[16])
{
	return any == 6 || (any == 4 && !memcmp(a, v4_mapped, 12));
}

static bool loopback_form(const unsigned char a[16])
{
	static const unsigned char loop6[16] = { [15] = 1 };

	return !memcmp(a, loop6, 16) || (!memcmp(a, v4_mapped, 12) && a[12] == 127);
}

bool gg_address_same_endpoint(const char *listen, const char *other, bool bind)
{
	char lh[256], oh[256];
	unsigned char la[2][16], oa[2][16];
	long lp, op;
	int l_any, o_any;

	split_address(listen, lh, sizeof(lh), &lp);
	split_address(other, oh, sizeof(oh), &op);
	if (lp != op)
		return false;
	if (!strcasecmp(lh, oh))
		return true;
	unsigned ln = host_addresses(lh, la, &l_any), on = host_addresses(oh, oa, &o_any);
	if (l_any && o_any)
		return true;
	/* A wildcard takes the connections to this host's own addresses of
	 * its family, and every bind of them. */
	if (l_any || o_any) {
		const int any = l_any ? l_any : o_any;
		unsigned char(*addrs)[16] = l_any ? oa : la;
		for (unsigned k = 0, n = l_any ? on : ln; k < n; k++)
			if (held_by(any, addrs[k]) && (bind || loopback_form(addrs[k])))
				return true;
		return false;
	}
	for (unsigned i = 0; i < ln; i++)
		for (unsigned k = 0; k < on; k++)
			if (!memcmp(la[i], oa[k], 16))
				return true;
	return false;
}

bool gg_address_is_loopback(const char *v)
{
	char host[256];
	unsigned char addrs[2][16];
	long port;
	int any;

	if (!strrchr(v, ':'))
		return false;
	split_address(v, host, sizeof(host), &port);
	return host_addresses(host, addrs, &any) && loopback_form(addrs[0]);
}

int gg_check_congestion(const char *v, char *why, size_t size)
{
	size_t n = strlen(v);

	if (n == 0 || n > 15)
		return gg_errf(why, size, -EINVAL, "\"%s\" is not a congestion control name (1 to 15 characters, "
			    "like \"bbr\" or \"cubic\")", v);
	for (size_t i = 0; i < n; i++)
		if (!((v[i] >= 'a' && v[i] <= 'z') || (v[i] >= '0' && v[i] <= '9') || v[i] == '_'))
			return gg_errf(why, size, -EINVAL, "\"%s\" is not a congestion control name (a-z, 0-9 and _, "
				    "like \"bbr\" or \"cubic\")", v);
	return 0;
}

int gg_check_control(const char *v, char *why, size_t size)
{
	if (!strncmp(v, "unix:", 5)) {
		const char *path = v + 5;
		if (path[0] != '/')
			return gg_errf(why, size, -EINVAL, "unix socket path \"%s\" must be absolute", path);
		if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
			return gg_errf(why, size, -EINVAL, "unix socket path is longer than %zu bytes",
				    sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
		return 0;
	}
	if (!strncmp(v, "tcp:", 4))
		return gg_errf(why, size, -EINVAL,
			       "\"%s\": tcp: endpoints are not supported yet (ranks share memory with the gateway); "
			       "use unix:/path",
			       v);
	return gg_errf(why, size, -EINVAL, "\"%s\" must be unix:/absolute/path", v);
}

int gg_check_identity(const char *v, char *why, size_t size)
{
	const char *reason;

	if (strncmp(v, "dns:", 4) && strncmp(v, "uri:", 4))
		return gg_errf(why, size, -EINVAL, "\"%s\" must be dns:NAME or uri:URI", v);
	if (gg_identity_check(v, &reason))
		return gg_errf(why, size, -EINVAL, "\"%s\": %s", v, reason);
	return 0;
}
