#include "tls_verify.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "identity.h"
#include "tls_internal.h"
#include "log.h"

int gg_tls_identity_parse(const char *text, struct gg_tls_identity *out, const char **why)
{
	int rc = gg_identity_check(text, why);

	if (rc)
		return rc;
	const char *name = text + 4; /* after "dns:" or "uri:" */
	if (strlen(name) >= sizeof(out->name)) {
		*why = "the identity is longer than 255 characters";
		return -EINVAL;
	}
	out->kind = !strncmp(text, "dns:", 4) ? GG_TLS_IDENTITY_DNS : GG_TLS_IDENTITY_URI;
	strcpy(out->name, name);
	return 0;
}

const char *gg_tls_identity_format(const struct gg_tls_identity *id, char *buf, size_t size)
{
	snprintf(buf, size, "%s:%s", id->kind == GG_TLS_IDENTITY_DNS ? "dns" : "uri", id->name);
	return buf;
}

int gg_tls_site_init(struct gg_tls_site *site, const char *name, const char *identity, const char **why)
{
	if (!name)
		name = "";
	if (strlen(name) >= sizeof(site->name)) {
		*why = "the site name is longer than 63 characters";
		return -EINVAL;
	}
	int rc = gg_tls_identity_parse(identity, &site->identity, why);
	if (rc)
		return rc;
	strcpy(site->name, name);
	site->denied = false;
	return 0;
}

const char *gg_tls_failure_name(enum gg_tls_failure failure)
{
	static const char *const names[] = {
		[GG_TLS_OK] = "ok",
		[GG_TLS_FAIL_TIMEOUT] = "timeout",
		[GG_TLS_FAIL_CLOSED] = "closed",
		[GG_TLS_FAIL_NOT_TLS] = "not-tls",
		[GG_TLS_FAIL_PROTOCOL_VERSION] = "protocol-version",
		[GG_TLS_FAIL_ALPN] = "alpn",
		[GG_TLS_FAIL_NO_CERT] = "no-cert",
		[GG_TLS_FAIL_UNKNOWN_CA] = "unknown-ca",
		[GG_TLS_FAIL_EXPIRED] = "expired",
		[GG_TLS_FAIL_REVOKED] = "revoked",
		[GG_TLS_FAIL_IDENTITY] = "identity",
		[GG_TLS_FAIL_USAGE] = "usage",
		[GG_TLS_FAIL_BAD_CERT] = "bad-cert",
		[GG_TLS_FAIL_GROUP] = "group",
		[GG_TLS_FAIL_REFUSED] = "refused",
		[GG_TLS_FAIL_DENIED] = "denied",
		[GG_TLS_FAIL_PROTOCOL] = "protocol",
	};
	if ((size_t)failure < GG_ARRAY_LEN(names) && names[failure])
		return names[failure];
	return "unknown";
}

static pthread_once_t check_index_once = PTHREAD_ONCE_INIT;
static int check_index = -1;

static void make_check_index(void)
{
	check_index = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

int gg_tls_check_index(void)
{
	pthread_once(&check_index_once, make_check_index);
	return check_index;
}

static struct gg_tls_check *check_of(const SSL *ssl)
{
	return SSL_get_ex_data(ssl, gg_tls_check_index());
}

/* snprintf that appends at *used and never overruns. */
GG_PRINTF(4, 5)
static void append(char *buf, size_t size, size_t *used, const char *fmt, ...)
{
	va_list ap;

	if (*used >= size)
		return;
	va_start(ap, fmt);
	int n = vsnprintf(buf + *used, size - *used, fmt, ap);
	va_end(ap);
	if (n > 0)
		*used = GG_MIN(size, *used + (size_t)n);
}

static void note_san_names(struct gg_tls_check *chk, X509 *cert)
{
	GENERAL_NAMES *names = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
	size_t used = 0;

	chk->presented[0] = '\0';
	for (int i = 0; names && i < sk_GENERAL_NAME_num(names); i++) {
		const GENERAL_NAME *gn = sk_GENERAL_NAME_value(names, i);
		const char *kind = gn->type == GEN_DNS ? "dns" : gn->type == GEN_URI ? "uri" : NULL;
		if (!kind)
			continue;
		const ASN1_IA5STRING *s = gn->d.ia5;
		char safe[GG_ESCAPED_SIZE(200)];
		/* The names are the peer's choice, read before it is trusted. */
		gg_escape(safe, sizeof(safe), (const char *)s->data, (size_t)GG_MIN(s->length, 200));
		append(chk->presented, sizeof(chk->presented), &used, "%s%s:%s", used ? ", " : "", kind, safe);
	}
	GENERAL_NAMES_free(names);
	if (!used)
		snprintf(chk->presented, sizeof(chk->presented), "no DNS or URI name");
}

static bool uri_san_matches(X509 *cert, const char *uri)
{
	GENERAL_NAMES *names = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
	size_t len = strlen(uri);
	bool found = false;

	for (int i = 0; names && i < sk_GENERAL_NAME_num(names) && !found; i++) {
		const GENERAL_NAME *gn = sk_GENERAL_NAME_value(names, i);
		found = gn->type == GEN_URI && (size_t)gn->d.uniformResourceIdentifier->length == len &&
			!memcmp(gn->d.uniformResourceIdentifier->data, uri, len);
	}
	GENERAL_NAMES_free(names);
	return found;
}

bool gg_tls_cert_names(X509 *cert, const struct gg_tls_identity *id)
{
	if (id->kind == GG_TLS_IDENTITY_URI)
		return uri_san_matches(cert, id->name);
	return X509_check_host(cert, id->name, strlen(id->name),
			       X509_CHECK_FLAG_NEVER_CHECK_SUBJECT | X509_CHECK_FLAG_NO_WILDCARDS, NULL) == 1;
}

int gg_tls_cert_file_names(const char *path, const struct gg_tls_identity *id, bool *names, char *err,
			   size_t err_size)
{
	FILE *f = fopen(path, "r");

	if (!f)
		return gg_errf(err, err_size, -errno, "cannot read certificate '%s': %s", path, strerror(errno));
	X509 *cert = PEM_read_X509(f, NULL, NULL, NULL);
	fclose(f);
	ERR_clear_error();
	if (!cert)
		return gg_errf(err, err_size, -EINVAL, "certificate '%s' holds no PEM certificate", path);
	*names = gg_tls_cert_names(cert, id);
	X509_free(cert);
	return 0;
}

void gg_tls_format_time(const ASN1_TIME *t, char *buf, size_t size)
{
	struct tm tm;

	if (t && ASN1_TIME_to_tm(t, &tm))
		strftime(buf, size, "%Y-%m-%d %H:%M:%S UTC", &tm);
	else
		snprintf(buf, size, "an unreadable date");
}

static void note_cert_detail(struct gg_tls_check *chk, X509 *cert, int depth, int error)
{
	char when[40];

	chk->cert_detail[0] = '\0';
	if (!cert)
		return;
	switch (error) {
	case X509_V_ERR_CERT_HAS_EXPIRED:
		gg_tls_format_time(X509_get0_notAfter(cert), when, sizeof(when));
		snprintf(chk->cert_detail, sizeof(chk->cert_detail), "expired %s", when);
		break;
	case X509_V_ERR_CERT_NOT_YET_VALID:
		gg_tls_format_time(X509_get0_notBefore(cert), when, sizeof(when));
		snprintf(chk->cert_detail, sizeof(chk->cert_detail), "valid from %s", when);
		break;
	case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
	case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
	case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
	case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
	case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN: {
		char dn[128], safe[sizeof(chk->cert_detail)];
		X509_NAME_oneline(X509_get_issuer_name(cert), dn, sizeof(dn));
		snprintf(chk->cert_detail, sizeof(chk->cert_detail), "issuer %s",
			 gg_escape(safe, sizeof(safe), dn, strlen(dn)));
		break;
	}
	case X509_V_ERR_CERT_REVOKED:
	case X509_V_ERR_UNABLE_TO_GET_CRL: {
		/* A CA between the certificate and the trusted one: name it. */
		char dn[128], safe[sizeof(chk->cert_detail) - 48];
		if (!depth)
			break;
		X509_NAME_oneline(X509_get_subject_name(cert), dn, sizeof(dn));
		snprintf(chk->cert_detail, sizeof(chk->cert_detail), "%s %s CA %s",
			 error == X509_V_ERR_CERT_REVOKED ? "revoked:" : "no CRL for",
			 X509_get_extension_flags(cert) & EXFLAG_SS ? "the trusted" : "intermediate",
			 gg_escape(safe, sizeof(safe), dn, strlen(dn)));
		break;
	}
	case X509_V_ERR_INVALID_PURPOSE: {
		/* One error for both extensions: say which one refuses the use. */
		uint32_t flags = X509_get_extension_flags(cert);
		uint32_t xku = chk->is_server ? XKU_SSL_CLIENT : XKU_SSL_SERVER;
		const char *whose = depth ? "its issuer's " : "";
		if ((flags & EXFLAG_XKUSAGE) && !(X509_get_extended_key_usage(cert) & xku))
			snprintf(chk->cert_detail, sizeof(chk->cert_detail), "%sextended key usage lacks %s", whose,
				 chk->is_server ? "clientAuth" : "serverAuth");
		else if (!depth && (flags & EXFLAG_KUSAGE) && !(X509_get_key_usage(cert) & KU_DIGITAL_SIGNATURE))
			snprintf(chk->cert_detail, sizeof(chk->cert_detail), "key usage lacks digitalSignature");
		break;
	}
	default:
		break;
	}
}

/* Site k of those the check knows: its `sites`, then its `others`. */
static const struct gg_tls_site *known_site(const struct gg_tls_check *chk, size_t k)
{
	return k < chk->site_count ? &chk->sites[k] : &chk->others[k - chk->site_count];
}

int gg_tls_verify_cb(int ok, X509_STORE_CTX *store)
{
	SSL *ssl = X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx());
	struct gg_tls_check *chk = ssl ? check_of(ssl) : NULL;
	X509 *leaf = X509_STORE_CTX_get0_cert(store);

	if (!chk)
		return 0;
	if (leaf && !chk->presented[0])
		note_san_names(chk, leaf);
	if (!ok) {
		if (!chk->verify_error) {
			chk->verify_error = X509_STORE_CTX_get_error(store);
			note_cert_detail(chk, X509_STORE_CTX_get_current_cert(store), X509_STORE_CTX_get_error_depth(store),
					 chk->verify_error);
		}
		return 0;
	}
	if (X509_STORE_CTX_get_error_depth(store) != 0) {
		/* A site's certificate made a CA's (CA:TRUE, or only a
		 * keyCertSign usage) could issue one naming another site: no
		 * issuer in the chain may name a site. */
		X509 *issuer = X509_STORE_CTX_get_current_cert(store);
		for (size_t k = 0; issuer && k < chk->site_count + chk->other_count; k++) {
			const struct gg_tls_site *o = known_site(chk, k);
			if (!gg_tls_cert_names(issuer, &o->identity))
				continue;
			chk->verify_error = X509_V_ERR_INVALID_CA;
			snprintf(chk->cert_detail, sizeof(chk->cert_detail),
				 "its issuer names site '%s', and a site's certificate may not issue others", o->name);
			X509_STORE_CTX_set_error(store, chk->verify_error);
			return 0;
		}
		return 1;
	}
	if (!leaf)
		return 1;
	/* TLS 1.3 proves the peer's key by a signature (RFC 8446, 4.4.2.2),
	 * whichever end it is: a key usage must allow signing. OpenSSL's
	 * purpose checks also let a server's keyEncipherment (RSA key
	 * transport, TLS 1.2) or a client's keyAgreement pass. */
	if ((X509_get_extension_flags(leaf) & EXFLAG_KUSAGE) && !(X509_get_key_usage(leaf) & KU_DIGITAL_SIGNATURE)) {
		chk->verify_error = X509_V_ERR_INVALID_PURPOSE;
		note_cert_detail(chk, leaf, 0, chk->verify_error);
		X509_STORE_CTX_set_error(store, chk->verify_error);
		return 0;
	}
	/* A site's certificate that may issue others could issue one that
	 * names another site, which would chain to the configured CA. */
	if (X509_get_extension_flags(leaf) & EXFLAG_CA) {
		chk->verify_error = X509_V_ERR_INVALID_PURPOSE;
		chk->ca_leaf = true;
		snprintf(chk->cert_detail, sizeof(chk->cert_detail),
			 "it is a CA's (basicConstraints CA:TRUE), which no site's may be");
		X509_STORE_CTX_set_error(store, chk->verify_error);
		return 0;
	}
	for (size_t i = 0; i < chk->site_count; i++) {
		if (!gg_tls_cert_names(leaf, &chk->sites[i].identity))
			continue;
		/* One that names another site's identity too would pass for
		 * that site as well: it proves neither. */
		const char *also = NULL;
		for (size_t k = 0; k < chk->site_count + chk->other_count && !also; k++) {
			const struct gg_tls_site *o = known_site(chk, k);
			if (strcmp(o->name, chk->sites[i].name) && gg_tls_cert_names(leaf, &o->identity))
				also = o->name;
		}
		if (!also) {
			chk->matched_site = i;
			return 1;
		}
		snprintf(chk->named_site, sizeof(chk->named_site), "%s", chk->sites[i].name);
		snprintf(chk->also_site, sizeof(chk->also_site), "%s", also);
		break;
	}
	chk->verify_error = X509_V_ERR_HOSTNAME_MISMATCH;
	X509_STORE_CTX_set_error(store, X509_V_ERR_HOSTNAME_MISMATCH);
	return 0;
}

void gg_tls_info_cb(const SSL *ssl, int where, int ret)
{
	struct gg_tls_check *chk;
	int desc = ret & 0xff;

	if (!(where & SSL_CB_ALERT) || desc == SSL3_AD_CLOSE_NOTIFY || !(chk = check_of(ssl)))
		return;
	if (where & SSL_CB_READ) {
		if (chk->alert_received < 0)
			chk->alert_received = desc;
	} else if (chk->alert_sent < 0) {
		chk->alert_sent = desc;
	}
}

static bool alpn_list_has(const unsigned char *list, size_t len, const char *proto, char *seen, size_t seen_size)
{
	size_t plen = strlen(proto), used = 0;
	bool found = false;

	seen[0] = '\0';
	while (len > 0) {
		size_t n = list[0];
		if (n == 0 || n + 1 > len)
			break;
		if (n == plen && !memcmp(list + 1, proto, plen))
			found = true;
		append(seen, seen_size, &used, "%s", used ? "," : "");
		for (size_t i = 1; i <= n; i++)
			append(seen, seen_size, &used, "%c",
			       isprint(list[i]) && list[i] != '"' && list[i] != '\\' ? list[i] : '?');
		list += n + 1;
		len -= n + 1;
	}
	return found;
}

static bool offers_tls13(SSL *ssl)
{
	const unsigned char *ext;
	size_t len;

	if (!SSL_client_hello_get0_ext(ssl, TLSEXT_TYPE_supported_versions, &ext, &len) || len < 1)
		return false;
	size_t n = GG_MIN((size_t)ext[0], len - 1);
	for (size_t i = 1; i + 1 <= n; i += 2)
		if (ext[i] == 0x03 && ext[i + 1] == 0x04)
			return true;
	return false;
}

/* Names the groups of a ClientHello's supported_groups extension. */
static void note_groups(SSL *ssl, struct gg_tls_check *chk)
{
	static const struct {
		unsigned id;
		const char *name;
	} known[] = {
		{ 0x0017, "P-256" },	 { 0x0018, "P-384" },	  { 0x0019, "P-521" },	   { 0x001d, "X25519" },
		{ 0x001e, "X448" },	 { 0x0100, "ffdhe2048" }, { 0x0101, "ffdhe3072" }, { 0x0102, "ffdhe4096" },
		{ 0x0103, "ffdhe6144" }, { 0x0104, "ffdhe8192" },
	};
	const unsigned char *ext;
	size_t len, used = 0;

	chk->groups_seen[0] = '\0';
	if (!SSL_client_hello_get0_ext(ssl, TLSEXT_TYPE_supported_groups, &ext, &len) || len < 2)
		return;
	size_t n = GG_MIN(len - 2, (size_t)(ext[0] << 8 | ext[1]));
	for (size_t i = 2; i + 1 < n + 2; i += 2) {
		unsigned id = (unsigned)ext[i] << 8 | ext[i + 1];
		const char *name = NULL;
		for (size_t k = 0; k < GG_ARRAY_LEN(known) && !name; k++)
			if (known[k].id == id)
				name = known[k].name;
		if (name)
			append(chk->groups_seen, sizeof(chk->groups_seen), &used, "%s%s", used ? "," : "", name);
		else
			append(chk->groups_seen, sizeof(chk->groups_seen), &used, "%s0x%04x", used ? "," : "", id);
	}
}

/* The ALPN select callback is not called when a client offers no ALPN at
 * all, so the requirement is enforced here, once the client offers TLS 1.3
 * (an older client is refused for its version first). */
int gg_tls_client_hello_cb(SSL *ssl, int *alert, void *arg)
{
	struct gg_tls_check *chk = check_of(ssl);
	const unsigned char *ext;
	size_t len;

	if (!chk || !offers_tls13(ssl))
		return SSL_CLIENT_HELLO_SUCCESS;
	note_groups(ssl, chk);
	if (SSL_client_hello_get0_ext(ssl, TLSEXT_TYPE_application_layer_protocol_negotiation, &ext, &len) &&
	    len >= 2 && alpn_list_has(ext + 2, GG_MIN(len - 2, (size_t)(ext[0] << 8 | ext[1])), GG_TLS_ALPN,
				      chk->alpn_seen, sizeof(chk->alpn_seen)))
		return SSL_CLIENT_HELLO_SUCCESS;
	if (!chk->alpn_seen[0])
		snprintf(chk->alpn_seen, sizeof(chk->alpn_seen), "none");
	chk->alpn_refused = true;
	*alert = SSL_AD_NO_APPLICATION_PROTOCOL;
	return SSL_CLIENT_HELLO_ERROR;
}

int gg_tls_alpn_select_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
			  unsigned int inlen, void *arg)
{
	static const unsigned char want[] = "\x0agradgate/1";

	if (SSL_select_next_proto((unsigned char **)out, outlen, want, sizeof(want) - 1, in, inlen) !=
	    OPENSSL_NPN_NEGOTIATED)
		return SSL_TLSEXT_ERR_ALERT_FATAL;
	return SSL_TLSEXT_ERR_OK;
}

bool gg_tls_check_alpn_selected(SSL *ssl, struct gg_tls_check *chk)
{
	const unsigned char *sel;
	unsigned int len;

	SSL_get0_alpn_selected(ssl, &sel, &len);
	if (len == strlen(GG_TLS_ALPN) && !memcmp(sel, GG_TLS_ALPN, len))
		return true;
	if (len)
		gg_escape(chk->alpn_seen, sizeof(chk->alpn_seen), (const char *)sel, GG_MIN(len, 64u));
	else
		snprintf(chk->alpn_seen, sizeof(chk->alpn_seen), "none");
	chk->alpn_refused = true;
	return false;
}

static const char *alert_name(int desc)
{
	switch (desc) {
	case SSL_AD_UNEXPECTED_MESSAGE: return "unexpected_message";
	case SSL_AD_BAD_RECORD_MAC: return "bad_record_mac";
	case SSL_AD_RECORD_OVERFLOW: return "record_overflow";
	case SSL_AD_HANDSHAKE_FAILURE: return "handshake_failure";
	case SSL_AD_BAD_CERTIFICATE: return "bad_certificate";
	case SSL_AD_UNSUPPORTED_CERTIFICATE: return "unsupported_certificate";
	case SSL_AD_CERTIFICATE_REVOKED: return "certificate_revoked";
	case SSL_AD_CERTIFICATE_EXPIRED: return "certificate_expired";
	case SSL_AD_CERTIFICATE_UNKNOWN: return "certificate_unknown";
	case SSL_AD_ILLEGAL_PARAMETER: return "illegal_parameter";
	case SSL_AD_UNKNOWN_CA: return "unknown_ca";
	case SSL_AD_ACCESS_DENIED: return "access_denied";
	case SSL_AD_DECODE_ERROR: return "decode_error";
	case SSL_AD_DECRYPT_ERROR: return "decrypt_error";
	case SSL_AD_PROTOCOL_VERSION: return "protocol_version";
	case SSL_AD_INSUFFICIENT_SECURITY: return "insufficient_security";
	case SSL_AD_INTERNAL_ERROR: return "internal_error";
	case SSL_AD_INAPPROPRIATE_FALLBACK: return "inappropriate_fallback";
	case SSL_AD_USER_CANCELLED: return "user_canceled";
	case SSL_AD_MISSING_EXTENSION: return "missing_extension";
	case SSL_AD_UNSUPPORTED_EXTENSION: return "unsupported_extension";
	case SSL_AD_UNRECOGNIZED_NAME: return "unrecognized_name";
	case SSL_AD_BAD_CERTIFICATE_STATUS_RESPONSE: return "bad_certificate_status_response";
	case SSL_AD_UNKNOWN_PSK_IDENTITY: return "unknown_psk_identity";
	case SSL_AD_CERTIFICATE_REQUIRED: return "certificate_required";
	case SSL_AD_NO_APPLICATION_PROTOCOL: return "no_application_protocol";
	default: return "unknown";
	}
}

static const char *refusal_reason(int desc, bool established)
{
	switch (desc) {
	case SSL_AD_CERTIFICATE_REQUIRED: return "peer requires a client certificate and we presented none";
	case SSL_AD_UNKNOWN_CA: return "peer does not trust the CA that issued our certificate";
	case SSL_AD_BAD_CERTIFICATE: return "peer rejected our certificate (wrong site identity or not valid yet?)";
	case SSL_AD_CERTIFICATE_EXPIRED: return "peer says our certificate has expired";
	case SSL_AD_CERTIFICATE_REVOKED: return "peer says our certificate is revoked";
	case SSL_AD_UNSUPPORTED_CERTIFICATE: return "peer says our certificate is not issued for this use";
	case SSL_AD_PROTOCOL_VERSION: return "peer does not accept TLS 1.3";
	case SSL_AD_NO_APPLICATION_PROTOCOL: return "peer does not speak " GG_TLS_ALPN " (ALPN)";
	case SSL_AD_HANDSHAKE_FAILURE: return "peer found no acceptable parameters (ciphersuites or key-exchange groups?)";
	case SSL_AD_ACCESS_DENIED: return "peer accepts our certificate but not connections from this site (access denied)";
	default: return established ? "peer ended the connection with an alert" : "peer refused the connection";
	}
}

struct reason {
	enum gg_tls_failure failure;
	const char *text;
};

static struct reason verify_reason(const struct gg_tls_check *chk)
{
	switch (chk->verify_error) {
	case X509_V_ERR_CERT_HAS_EXPIRED:
		return (struct reason){ GG_TLS_FAIL_EXPIRED, "certificate has expired" };
	case X509_V_ERR_CERT_NOT_YET_VALID:
		return (struct reason){ GG_TLS_FAIL_EXPIRED, "certificate is not valid yet" };
	case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
	case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
	case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
	case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
	case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
		return (struct reason){ GG_TLS_FAIL_UNKNOWN_CA, "certificate is not issued by the configured CA (unknown CA)" };
	case X509_V_ERR_CERT_REVOKED:
		return (struct reason){ GG_TLS_FAIL_REVOKED, "certificate is revoked by the configured CRL" };
	case X509_V_ERR_UNABLE_TO_GET_CRL:
		return (struct reason){ GG_TLS_FAIL_BAD_CERT, "no CRL of the certificate's issuer is configured" };
	case X509_V_ERR_CRL_HAS_EXPIRED:
		return (struct reason){ GG_TLS_FAIL_BAD_CERT, "the configured CRL has expired" };
	case X509_V_ERR_INVALID_PURPOSE:
		if (chk->ca_leaf)
			return (struct reason){ GG_TLS_FAIL_USAGE, "certificate may issue others, which no site's may" };
		return (struct reason){ GG_TLS_FAIL_USAGE,
					chk->is_server ? "certificate is not issued for TLS client authentication"
						       : "certificate is not issued for TLS server authentication" };
	case X509_V_ERR_HOSTNAME_MISMATCH:
		return (struct reason){ GG_TLS_FAIL_IDENTITY, NULL };
	default:
		return (struct reason){ GG_TLS_FAIL_BAD_CERT, X509_verify_cert_error_string(chk->verify_error) };
	}
}

static bool reason_is_not_tls(int r)
{
	return r == SSL_R_WRONG_VERSION_NUMBER || r == SSL_R_HTTP_REQUEST || r == SSL_R_HTTPS_PROXY_REQUEST ||
	       r == SSL_R_PACKET_LENGTH_TOO_LONG || r == SSL_R_RECORD_LENGTH_MISMATCH ||
	       r == SSL_R_UNEXPECTED_RECORD || r == SSL_R_UNEXPECTED_MESSAGE || r == SSL_R_LENGTH_MISMATCH ||
	       r == SSL_R_BAD_PACKET_LENGTH || r == SSL_R_UNKNOWN_PROTOCOL || r == SSL_R_LENGTH_TOO_SHORT ||
	       r == SSL_R_BAD_PACKET || r == SSL_R_RECORD_TOO_SMALL;
}

enum gg_tls_failure gg_tls_explain(const struct gg_tls_check *chk, int ssl_reason, const char *ssl_reason_text,
				   char *buf, size_t size)
{
	char text[200], detail[GG_TLS_NAMES_MAX + 200];
	size_t dl = 0, used = 0, allowed = 0, first_allowed = 0;
	struct reason r = { GG_TLS_FAIL_PROTOCOL, NULL };
	bool show_names = false;

	/* The expected identities are those of the sites that may connect. */
	for (size_t i = chk->site_count; i-- > 0;)
		if (!chk->sites[i].denied) {
			allowed++;
			first_allowed = i;
		}
	detail[0] = '\0';
	if (chk->timed_out) {
		snprintf(text, sizeof(text), "handshake not completed within %llu ms", (unsigned long long)chk->timeout_ms);
		r = (struct reason){ GG_TLS_FAIL_TIMEOUT, text };
	} else if (chk->verify_error) {
		r = verify_reason(chk);
		show_names = true;
		if (r.failure == GG_TLS_FAIL_IDENTITY) {
			if (chk->also_site[0])
				snprintf(text, sizeof(text),
					 "certificate names site '%s' and site '%s' too, so it could pass for either",
					 chk->named_site, chk->also_site);
			else if (allowed == 1 && chk->sites[first_allowed].name[0])
				snprintf(text, sizeof(text), "certificate does not name site '%s'", chk->sites[first_allowed].name);
			else if (allowed == 1)
				snprintf(text, sizeof(text), "certificate does not name the expected site");
			else if (allowed == 0)
				snprintf(text, sizeof(text), "certificate names no site known here");
			else
				snprintf(text, sizeof(text), "certificate names none of the %zu allowed sites", allowed);
			r.text = text;
		}
		if (chk->cert_detail[0])
			append(detail, sizeof(detail), &dl, "; %s", chk->cert_detail);
	} else if (chk->denied) {
		snprintf(text, sizeof(text), "site '%s' may not open connections to this site",
			 chk->sites[chk->matched_site].name);
		r = (struct reason){ GG_TLS_FAIL_DENIED, text };
		show_names = true;
	} else if (chk->alpn_refused) {
		r = (struct reason){ GG_TLS_FAIL_ALPN,
				     chk->is_server ? "peer does not offer ALPN " GG_TLS_ALPN
						    : "peer did not select ALPN " GG_TLS_ALPN };
		append(detail, sizeof(detail), &dl, "; %s %s", chk->is_server ? "offered" : "selected", chk->alpn_seen);
	} else if (chk->alert_received >= 0) {
		r = (struct reason){ chk->alert_received == SSL_AD_ACCESS_DENIED ? GG_TLS_FAIL_DENIED : GG_TLS_FAIL_REFUSED,
				     refusal_reason(chk->alert_received, chk->established) };
		append(detail, sizeof(detail), &dl, "; alert %s", alert_name(chk->alert_received));
	} else if (ssl_reason == SSL_R_NO_SUITABLE_KEY_SHARE || ssl_reason == SSL_R_NO_SHARED_GROUPS) {
		r = (struct reason){ GG_TLS_FAIL_GROUP, chk->is_server ? "peer offers no key-exchange group we accept"
								      : "peer accepts none of our key-exchange groups" };
		if (chk->is_server && chk->groups_seen[0])
			append(detail, sizeof(detail), &dl, "; offered %s", chk->groups_seen);
	} else if (ssl_reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE) {
		r = (struct reason){ GG_TLS_FAIL_NO_CERT, "no client certificate presented" };
	} else if (ssl_reason == SSL_R_UNSUPPORTED_PROTOCOL || ssl_reason == SSL_R_UNSUPPORTED_SSL_VERSION ||
		   ssl_reason == SSL_R_TLSV1_ALERT_PROTOCOL_VERSION) {
		r = (struct reason){ GG_TLS_FAIL_PROTOCOL_VERSION, "peer does not offer TLS 1.3 (protocol version)" };
	} else if (chk->eof && (!chk->saw_bytes || !ssl_reason || ssl_reason == SSL_R_UNEXPECTED_EOF_WHILE_READING)) {
		r = (struct reason){ GG_TLS_FAIL_CLOSED, chk->established ? "connection closed without close_notify (data may be truncated)"
									   : "connection closed during the TLS handshake" };
	} else if (!chk->established && reason_is_not_tls(ssl_reason)) {
		snprintf(text, sizeof(text), "peer did not start a TLS handshake (%s)", ssl_reason_text);
		r = (struct reason){ GG_TLS_FAIL_NOT_TLS, text };
	} else {
		snprintf(text, sizeof(text), "TLS failure: %s", ssl_reason_text && *ssl_reason_text ? ssl_reason_text : "unknown");
		r.text = text;
	}
	if (chk->alert_sent >= 0 && chk->alert_received < 0 && r.failure != GG_TLS_FAIL_CLOSED)
		append(detail, sizeof(detail), &dl, "; sent alert %s", alert_name(chk->alert_sent));
	if (show_names && chk->presented[0])
		append(detail, sizeof(detail), &dl, "; certificate names %s", chk->presented);

	/* A peer that proved its identity and then ended the connection is
	 * named by it (a close carries no alert or names to add); one that
	 * failed on the way, by what was expected. */
	if (r.failure == GG_TLS_FAIL_CLOSED && chk->established && chk->matched_site < chk->site_count &&
	    !chk->sites[chk->matched_site].denied) {
		const struct gg_tls_site *site = &chk->sites[chk->matched_site];
		char id[GG_TLS_IDENTITY_MAX + 8];
		append(buf, size, &used, "peer %s: %s (%s%s%s%s)", chk->peer_addr, r.text, site->name[0] ? "site " : "",
		       site->name, site->name[0] ? ", " : "", gg_tls_identity_format(&site->identity, id, sizeof(id)));
		return r.failure;
	}
	append(buf, size, &used, "peer %s: %s (expected identity ", chk->peer_addr, r.text);
	for (size_t i = 0, n = 0; i < chk->site_count; i++) {
		char id[GG_TLS_IDENTITY_MAX + 8];
		if (chk->sites[i].denied)
			continue;
		append(buf, size, &used, "%s%s", n == 0 ? "" : n + 1 == allowed ? " or " : ", ",
		       gg_tls_identity_format(&chk->sites[i].identity, id, sizeof(id)));
		n++;
	}
	if (!allowed)
		append(buf, size, &used, "none: no site may connect here");
	append(buf, size, &used, "%s)", detail);
	return r.failure;
}
