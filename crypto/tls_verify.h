/* Site identities and the reasons a TLS handshake fails.
 *
 * A peer is accepted only when its certificate chains to the configured CA
 * AND carries, as a subjectAltName, the identity configured for the site it
 * claims to be. The subject CN is never consulted. Identities are written
 * as in the config file: "dns:site-b.gradgate.test" (a dNSName SAN, exact
 * match, case-insensitive, no wildcards) or "uri:spiffe://gradgate/site-b"
 * (a uniformResourceIdentifier SAN, exact, byte for byte). */
#ifndef GG_TLS_VERIFY_H
#define GG_TLS_VERIFY_H

#include <stdbool.h>
#include <stddef.h>

#include "gg_common.h"

#define GG_TLS_IDENTITY_MAX 256 /* bytes of the name after "dns:"/"uri:", NUL included */
#define GG_TLS_SITE_NAME_MAX 64 /* NUL included */
#define GG_TLS_MAX_SITES 16     /* sites one engine or context is told of */

enum gg_tls_identity_kind {
	GG_TLS_IDENTITY_DNS,
	GG_TLS_IDENTITY_URI,
};

struct gg_tls_identity {
	enum gg_tls_identity_kind kind;
	char name[GG_TLS_IDENTITY_MAX]; /* without the "dns:" / "uri:" prefix */
};

/* A site a peer may be: its name, for messages, and the identity its
 * certificate must carry. */
struct gg_tls_site {
	char name[GG_TLS_SITE_NAME_MAX]; /* "" when unknown */
	struct gg_tls_identity identity;
	/* Server side: a site known here that may not connect. A peer that
	 * proves this identity is refused with an access_denied alert once
	 * its handshake completed, so it learns that its certificate is good
	 * and that it is its connection that is not wanted. */
	bool denied;
};

/* Parses "dns:NAME" or "uri:URI". DNS names are 1..253 bytes of labels of
 * letters, digits and '-' (1..63 each, no leading or trailing '-'), no
 * wildcard, no trailing dot. URIs need a scheme ("spiffe:", "https:", ...)
 * and may not hold spaces or control bytes. Returns 0, or -EINVAL with
 * `why` saying what is wrong. */
GG_MUST_CHECK int gg_tls_identity_parse(const char *text, struct gg_tls_identity *out, const char **why);

/* Writes the "dns:NAME" / "uri:URI" form into buf (truncating to size);
 * returns buf. */
const char *gg_tls_identity_format(const struct gg_tls_identity *id, char *buf, size_t size);

/* Whether the certificate in the PEM file at `path` (its first) carries
 * the identity: 0 with *names set, or a negative errno with err naming the
 * file and the problem (unreadable, no PEM certificate). */
GG_MUST_CHECK int gg_tls_cert_file_names(const char *path, const struct gg_tls_identity *id, bool *names,
					 char *err, size_t err_size);

/* Fills a site from its name and identity text (not denied); -EINVAL
 * (with `why`) when the identity does not parse or the name is too long. */
GG_MUST_CHECK int gg_tls_site_init(struct gg_tls_site *site, const char *name, const char *identity,
				   const char **why);

/* Why a handshake or connection failed; the engine's message says it in
 * words, naming the peer address and the expected identity. */
enum gg_tls_failure {
	GG_TLS_OK = 0,
	GG_TLS_FAIL_TIMEOUT,          /* the handshake deadline passed */
	GG_TLS_FAIL_CLOSED,           /* the peer closed the connection mid-handshake */
	GG_TLS_FAIL_NOT_TLS,          /* the peer's bytes are not a TLS handshake */
	GG_TLS_FAIL_PROTOCOL_VERSION, /* the peer offers no TLS 1.3 */
	GG_TLS_FAIL_ALPN,             /* the peer does not speak gradgate/1 */
	GG_TLS_FAIL_NO_CERT,          /* the peer presented no certificate */
	GG_TLS_FAIL_UNKNOWN_CA,       /* its certificate does not chain to our CA */
	GG_TLS_FAIL_EXPIRED,          /* expired or not yet valid */
	GG_TLS_FAIL_REVOKED,          /* listed in the configured CRL */
	GG_TLS_FAIL_IDENTITY,         /* valid, but names no expected site */
	GG_TLS_FAIL_USAGE,            /* not issued for TLS client/server auth */
	GG_TLS_FAIL_BAD_CERT,         /* any other certificate problem */
	GG_TLS_FAIL_GROUP,            /* the peer offers no key-exchange group we accept */
	GG_TLS_FAIL_REFUSED,          /* the peer refused us with an alert */
	GG_TLS_FAIL_DENIED,           /* a known site that may not connect (access_denied): the
				       * server refused it, or the client was told so */
	GG_TLS_FAIL_PROTOCOL,         /* any other TLS failure */
};

/* "timeout", "closed", "not-tls", "protocol-version", "alpn", "no-cert",
 * "unknown-ca", "expired", "revoked", "identity", "usage", "bad-cert",
 * "group", "refused", "denied", "protocol"; "ok" for GG_TLS_OK. */
const char *gg_tls_failure_name(enum gg_tls_failure failure);

#endif
