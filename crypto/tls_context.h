/* TLS contexts: the credentials and policy every connection of a gateway
 * shares. TLS 1.3 only; both sides present certificates chaining to the
 * configured CA bundle; ALPN "gradgate/1" is required of every peer; no
 * session resumption, so every connection verifies the peer's certificate
 * against the CA, CRL and identity in force when it connects.
 *
 * One context serves both roles: connections it accepts and connections it
 * makes (see tls_engine.h). It is safe to create engines from several
 * threads while another thread reloads the context. */
#ifndef GG_TLS_CONTEXT_H
#define GG_TLS_CONTEXT_H

#include <stdbool.h>
#include <stddef.h>

#include "gg_common.h"
#include "tls_verify.h"

#define GG_TLS_ALPN "gradgate/1"
#define GG_TLS_DEFAULT_CIPHERSUITES "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256"
/* Key exchange only over elliptic curves: a handshake costs about a
 * millisecond of CPU, whatever the client asks for. */
#define GG_TLS_DEFAULT_GROUPS "X25519:P-256"

/* Everything the context reads. Strings are only read during
 * gg_tls_context_new(); the context keeps its own copies, which
 * gg_tls_context_reload() reads again. */
struct gg_tls_options {
	const char *ca_file;   /* PEM bundle of the CAs peers must chain to */
	const char *cert_file; /* PEM: this site's certificate, then intermediates */
	const char *key_file;  /* PEM, unencrypted; refused when group or others may read or write it */
	const char *crl_file;  /* optional PEM CRL(s) of the CA; NULL: no revocation check */
	const char *ciphersuites; /* OpenSSL TLS 1.3 names, ':'-separated, preferred first; NULL: the default */
	const char *groups;       /* key-exchange groups, ':'-separated, preferred first; NULL: the default */

	/* In-memory PEM used instead of the matching file when non-NULL: the
	 * throwaway credentials of gradgate-bench and of tests. */
	const char *ca_pem;
	const char *cert_pem;
	const char *key_pem;

	/* This site's peers: its own certificate may name none of them. One
	 * that does is a peer's certificate put in its place, or one that
	 * passes for two sites: every peer would refuse it. Copied; at most
	 * GG_TLS_MAX_SITES. */
	const struct gg_tls_site *peers;
	size_t peer_count;

	/* Tests that play a misconfigured peer: this site's certificate is not
	 * checked the way its peers will check it (chain to the CA, CRL, TLS
	 * client and server use). */
	bool unchecked_own_cert;
};

struct gg_tls_context;

/* Builds a context. Returns 0 and sets *out (free with
 * gg_tls_context_free), or a negative errno with one line in `err` naming
 * the file and the problem: -ENOENT/-EACCES (unreadable file), -EPERM (key
 * accessible by group or others), -EINVAL (bad PEM, key does not match the
 * certificate, expired own certificate, one naming a peer, unknown
 * ciphersuite, more than GG_TLS_MAX_SITES peers), -ENOMEM. */
GG_MUST_CHECK int gg_tls_context_new(const struct gg_tls_options *opts, struct gg_tls_context **out,
				     char *err, size_t err_size);

/* Reads the CA, certificate, key and CRL files again (the daemon calls this
 * on SIGHUP). New connections use the new credentials; established ones
 * keep theirs. On failure the context keeps its previous credentials and
 * the return value and `err` are as for gg_tls_context_new(). */
GG_MUST_CHECK int gg_tls_context_reload(struct gg_tls_context *ctx, char *err, size_t err_size);

/* How many times the credentials were loaded: 1 after creation, +1 per
 * successful reload. */
unsigned gg_tls_context_generation(struct gg_tls_context *ctx);

/* Frees the context; engines created from it stay valid. NULL is allowed. */
void gg_tls_context_free(struct gg_tls_context *ctx);

/* Refuses a private key file that is not a regular file or that group or
 * others may access (mode & 077), as ssh does. Returns 0, -EPERM (with a
 * message saying which mode to set), or the negative errno of stat(). */
GG_MUST_CHECK int gg_tls_check_key_permissions(const char *path, char *err, size_t err_size);

/* A ':'-separated list of TLS 1.3 ciphersuites (IANA names) that a context
 * accepts: 0, or -EINVAL with err naming the unknown or refused one. */
GG_MUST_CHECK int gg_tls_check_ciphersuites(const char *list, char *err, size_t err_size);

#endif
