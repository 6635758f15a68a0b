/* The text of a site identity, as a peer's certificate must carry it and
 * as [[peers]] identity names it: "dns:NAME" (a DNS name of 1 to 253
 * characters whose labels hold 1 to 63 letters, digits and '-', neither
 * first nor last) or "uri:URI" (a scheme of letters, digits, '+', '-' and
 * '.' starting with a letter, then ':' and at least one more byte; no
 * spaces, control or non-ASCII bytes). One rule for the config check and
 * for the TLS layer, so a config the check passes is one the gateway
 * starts with. */
#ifndef GG_IDENTITY_H
#define GG_IDENTITY_H

#include "gg_common.h"

/* 0, or -EINVAL with *why set to a static sentence saying what is wrong. */
GG_MUST_CHECK int gg_identity_check(const char *text, const char **why);

#endif
