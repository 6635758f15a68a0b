/* Validators for the config's string values. Each returns 0, or -EINVAL
 * with a sentence in `why` that says what is wrong with the value. */
#ifndef GG_CONFIG_CHECK_H
#define GG_CONFIG_CHECK_H

#include <stdbool.h>
#include <stddef.h>

typedef int (*gg_check_fn)(const char *value, char *why, size_t why_size);

/* 1-63 of [a-z0-9-], starting and ending with a letter or digit. */
int gg_check_site_name(const char *value, char *why, size_t why_size);
/* "host:port" or "[v6addr]:port", port 1-65535. */
int gg_check_address(const char *value, char *why, size_t why_size);
/* A TCP congestion control's name as the kernel spells them: 1-15 of
 * a-z 0-9 _ (whether this kernel has it is checked at start). */
int gg_check_congestion(const char *value, char *why, size_t why_size);
/* Whether a valid "host:port" names this host's loopback interface:
 * 127.0.0.0/8, ::1 (also as ::ffff:127.x.y.z), or the name localhost. */
bool gg_address_is_loopback(const char *value);
/* Whether valid "host:port" `other` is the endpoint a socket bound at
 * valid `listen` holds: the same port, and the same host name or address
 * (localhost as 127.0.0.1 and ::1), or a loopback address of the family a
 * wildcard `listen` holds (0.0.0.0: IPv4; [::]: both). `bind`: whether
 * binding `other` is what is asked, which clashes with a wildcard on
 * either side for every address of the wildcard's family. Host names
 * other than localhost are compared as written: they are not resolved. */
bool gg_address_same_endpoint(const char *listen, const char *other, bool bind);
/* "unix:/absolute/path" (host mode shares memory with its ranks, so a
 * tcp: endpoint is refused with a message saying so). */
int gg_check_control(const char *value, char *why, size_t why_size);
/* "dns:NAME" or "uri:SCHEME:REST". */
int gg_check_identity(const char *value, char *why, size_t why_size);

#endif
