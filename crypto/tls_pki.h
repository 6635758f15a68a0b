/* Throwaway certificates made in memory: a CA and ECDSA P-256 site
 * certificates it issues. gradgate-bench uses them so that it runs without
 * any setup, and tests use them to make the certificates that must be
 * refused. Never for production: keys live only in this process. */
#ifndef GG_TLS_PKI_H
#define GG_TLS_PKI_H

#include <stdbool.h>

#include "gg_common.h"

struct gg_tls_pki;

/* Creates a self-signed CA "CN=<ca_name>" valid from an hour ago for a
 * day. Returns 0 and sets *out (free with gg_tls_pki_free), -EINVAL, or
 * -ENOMEM. */
GG_MUST_CHECK int gg_tls_pki_new(const char *ca_name, struct gg_tls_pki **out);
void gg_tls_pki_free(struct gg_tls_pki *pki);

/* The CA certificate, PEM; owned by the pki. */
const char *gg_tls_pki_ca_pem(const struct gg_tls_pki *pki);

struct gg_tls_cert_request {
	const char *identity;   /* "dns:NAME" or "uri:URI": the certificate's SAN */
	const char *also;       /* a second SAN of the same forms; NULL: none */
	const char *common_name; /* subject CN; NULL: the identity's name (never trusted) */
	long valid_from_s;      /* notBefore, seconds from now (negative: in the past) */
	long valid_until_s;     /* notAfter, seconds from now; 0: one day */
	bool no_client_auth;    /* leave clientAuth out of the extended key usage */
	bool no_server_auth;    /* leave serverAuth out */
	bool no_signature;      /* key usage keyEncipherment only, not digitalSignature */
	bool ca;                /* basicConstraints CA:TRUE, as no site's should be */
};

/* Issues a certificate and its new key. Returns 0 with *cert_pem and
 * *key_pem malloc'd (the caller frees both), -EINVAL (bad identity), or
 * -ENOMEM; on failure both are NULL. */
GG_MUST_CHECK int gg_tls_pki_issue(struct gg_tls_pki *pki, const struct gg_tls_cert_request *req, char **cert_pem,
				   char **key_pem);

#endif
