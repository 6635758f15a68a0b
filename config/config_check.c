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
	if (!*port || *end || errno || port[0] == '-' || port[0] == '+')
		return gg_errf(why, size, -EINVAL, "port \"%s\" is not a number", port);
	if (p < 1 || p > 65535)
		return gg_errf(why, size, -EINVAL, "port %ld is out of range (1-65535)", p);
	return 0;
}

bool gg_address_is_loopback(const char *v)
{
	const char *colon = strrchr(v, ':');
	char host[256];
	unsigned char addr[16];
	size_t len;

	if (!colon)
		return false;
	if (v[0] == '[') {
		len = (size_t)(colon - v) - 2;
		if (colon - v < 2 || len >= sizeof(host))
			return false;
		memcpy(host, v + 1, len);
	} else {
		len = (size_t)(colon - v);
		if (len >= sizeof(host))
			return false;
		memcpy(host, v, len);
	}
	host[len] = '\0';
	if (!strcasecmp(host, "localhost"))
		return true;
	if (inet_pton(AF_INET, host, addr) == 1)
		return addr[0] == 127;
	if (inet_pton(AF_INET6, host, addr) != 1)
		return false;
	static const unsigned char loop6[16] = { [15] = 1 };
	static const unsigned char mapped[12] = { [10] = 0xff, [11] = 0xff };
	return !memcmp(addr, loop6, 16) || (!memcmp(addr, mapped, 12) && addr[12] == 127);
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
