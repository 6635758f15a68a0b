/* Shared by the files of crypto/ only. */
#ifndef GG_TLS_INTERNAL_H
#define GG_TLS_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>
#include <openssl/ssl.h>

#include "tls_context.h"
#include "tls_verify.h"

#define GG_TLS_NAMES_MAX 256

/* The application traffic secrets of one connection, as the keylog
 * callback receives them while the handshake derives them. */
struct gg_tls_secrets {
	uint8_t client[EVP_MAX_MD_SIZE], server[EVP_MAX_MD_SIZE];
	size_t client_len, server_len; /* 0: not seen */
};

/* What one connection learned while its handshake ran: filled by the
 * OpenSSL callbacks below, read by gg_tls_explain(). Owned by the engine
 * and attached to its SSL as ex_data. */
struct gg_tls_check {
	const struct gg_tls_site *sites;
	size_t site_count;
	const struct gg_tls_site *others; /* gg_tls_engine_config's */
	size_t other_count;
	const char *peer_addr;
	bool is_server;

	size_t matched_site;  /* SIZE_MAX until the peer proved a site */
	bool denied;          /* server: that site is denied, and was refused with access_denied */
	int verify_error;     /* the X509_V_ERR_* that refused the peer; 0: none */
	bool ca_leaf;         /* refused as a CA's certificate (under X509_V_ERR_INVALID_PURPOSE) */
	char cert_detail[160]; /* dates or issuer of the certificate at fault */
	/* A certificate refused for naming two sites: the one looked for,
	 * and the other whose identity it names too. */
	char named_site[64], also_site[64];
	char presented[GG_TLS_NAMES_MAX]; /* the SAN names the peer's certificate carries */
	int alert_sent;       /* fatal alert descriptions; -1: none */
	int alert_received;
	bool alpn_refused;
	char alpn_seen[96];   /* what the peer offered (server) or selected (client) */
	char groups_seen[96]; /* the key-exchange groups a client offered */
	bool timed_out;
	uint64_t timeout_ms;
	bool established;     /* the handshake had completed */
	bool eof;             /* the peer closed its end */
	bool saw_bytes;       /* the peer sent anything at all */
	struct gg_tls_secrets *secrets; /* where gg_tls_keylog_cb puts them */
};

GG_MUST_CHECK int gg_tls_check_index(void);

/* Whether the certificate carries the identity (its DNS or URI SAN). */
bool gg_tls_cert_names(X509 *cert, const struct gg_tls_identity *id);

/* The current SSL_CTX with a reference taken for the caller (SSL_CTX_free
 * it), or NULL. */
SSL_CTX *gg_tls_context_get_ssl_ctx(struct gg_tls_context *ctx);

/* A certificate's date as "2026-12-05 07:00:00 UTC". */
void gg_tls_format_time(const ASN1_TIME *t, char *buf, size_t size);

/* OpenSSL callbacks installed on every SSL_CTX. */
int gg_tls_verify_cb(int ok, X509_STORE_CTX *store);
void gg_tls_info_cb(const SSL *ssl, int where, int ret);
int gg_tls_client_hello_cb(SSL *ssl, int *alert, void *arg);
int gg_tls_alpn_select_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
			  const unsigned char *in, unsigned int inlen, void *arg);
/* Keeps CLIENT_TRAFFIC_SECRET_0 and SERVER_TRAFFIC_SECRET_0 in the
 * connection's gg_tls_secrets; every other line is dropped. Nothing is
 * written anywhere else. */
void gg_tls_keylog_cb(const SSL *ssl, const char *line);

/* THE place that turns what went wrong into a failure kind and one line
 * for people: "peer ADDR: REASON (expected identity ID[; DETAIL])".
 * `ssl_reason` is ERR_GET_REASON of the first OpenSSL error (0: none). */
enum gg_tls_failure gg_tls_explain(const struct gg_tls_check *chk, int ssl_reason, const char *ssl_reason_text,
				   char *buf, size_t size);

/* Client side, after the handshake: the server must have selected ALPN
 * gradgate/1. Returns true when it did; otherwise records why in chk. */
bool gg_tls_check_alpn_selected(SSL *ssl, struct gg_tls_check *chk);

#endif
