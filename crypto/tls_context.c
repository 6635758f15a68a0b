#include "tls_context.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "fileio.h"
#include "log.h"
#include "tls_internal.h"

struct gg_tls_context {
	pthread_mutex_t lock;
	SSL_CTX *ssl_ctx;
	unsigned generation;
	struct gg_tls_options opts; /* strings owned by the context */
};

GG_PRINTF(4, 5)
static int fail(char *err, size_t size, int rc, const char *fmt, ...)
{
	va_list ap;

	if (size) {
		va_start(ap, fmt);
		vsnprintf(err, size, fmt, ap);
		va_end(ap);
	}
	return rc;
}

static const char *openssl_reason(void)
{
	const char *r = ERR_reason_error_string(ERR_peek_last_error());
	return r ? r : "unknown OpenSSL error";
}

/* The owner of the key, CA or CRL file may read or replace it: only the
 * gateway's user or root may be. */
static int check_owner(const struct stat *st, const char *what, const char *path, char *err, size_t size)
{
	char why[PATH_MAX + 256];

	if (gg_owner_refusal(st->st_uid, path, why, sizeof(why)))
		return fail(err, size, -EPERM, "%s '%s' %s", what, path, why);
	return 0;
}

static int check_key_mode(const struct stat *st, const char *path, char *err, size_t size)
{
	if (!S_ISREG(st->st_mode))
		return fail(err, size, -EPERM, "private key '%s' is not a regular file", path);
	if (st->st_mode & 077)
		return fail(err, size, -EPERM,
			    "private key '%s' has permissions %04o: group or others may access it "
			    "(run chmod 600 on it)",
			    path, (unsigned)(st->st_mode & 07777));
	return check_owner(st, "private key", path, err, size);
}

int gg_tls_check_key_permissions(const char *path, char *err, size_t err_size)
{
	struct stat st;

	if (stat(path, &st))
		return fail(err, err_size, -errno, "cannot read private key '%s': %s", path, strerror(errno));
	return check_key_mode(&st, path, err, err_size);
}

/* The CA and CRL files say whom the gateway trusts: whoever may write one
 * could add a CA of their own, or take a revocation back. */
static int check_trust_mode(FILE *f, const char *path, const char *what, char *err, size_t size)
{
	struct stat st;

	if (fstat(fileno(f), &st))
		return fail(err, size, -errno, "cannot read %s '%s': %s", what, path, strerror(errno));
	if (st.st_mode & 022)
		return fail(err, size, -EPERM,
			    "%s '%s' has permissions %04o: group or others may write it, and so choose whom this "
			    "gateway trusts (run chmod go-w on it)",
			    what, path, (unsigned)(st.st_mode & 07777));
	int rc = check_owner(&st, what, path, err, size);
	char why[PATH_MAX + 256];
	if (!rc && (rc = gg_path_guarded(path, GG_TRUST_PATH_CONSEQUENCE, why, sizeof(why))))
		fail(err, size, rc, "%s '%s': %s", what, path, why);
	return rc;
}

/* Whether the PEM file holds a private key ("-----BEGIN ... PRIVATE
 * KEY-----", of any kind); leaves the file at its start. */
static bool holds_private_key(FILE *f)
{
	char line[128];
	bool found = false, line_start = true;

	while (!found && fgets(line, sizeof(line), f)) {
		found = line_start && !strncmp(line, "-----BEGIN ", 11) && strstr(line, "PRIVATE KEY-----");
		line_start = strchr(line, '\n') != NULL;
	}
	rewind(f);
	return found;
}

/* A private key in a file that is not the key file: OpenSSL would skip it
 * here, but whoever may read the file has it. The certificate may share
 * the key's file, and is then held to the key's rules; a CA or CRL file
 * never holds one: a CA's key belongs on no gateway's host, and those
 * files are read by the gateway's user only as its trust. */
static int check_stray_key(FILE *f, const char *path, const char *what, bool trust, char *err, size_t size)
{
	struct stat st;

	if (fstat(fileno(f), &st))
		return fail(err, size, -errno, "cannot read %s '%s': %s", what, path, strerror(errno));
	/* A pipe would be read up to its end here, and could not be read
	 * again: only a file is looked through. */
	if (!S_ISREG(st.st_mode) || !holds_private_key(f))
		return 0;
	if (trust)
		return fail(err, size, -EPERM,
			    "%s '%s' holds a private key: take it out (a CA's key belongs on no gateway's host)",
			    what, path);
	if (st.st_mode & 077)
		return fail(err, size, -EPERM,
			    "%s '%s' holds a private key and has permissions %04o: group or others may read the key "
			    "(run chmod 600 on it, or keep the key in the key file only)",
			    what, path, (unsigned)(st.st_mode & 07777));
	return check_owner(&st, what, path, err, size);
}

/* A BIO over the in-memory PEM when given, else over the file (when
 * `trust`, a CA or CRL file, only where nobody else may write it; no
 * file but the key's may hold a key group or others can read). */
static BIO *open_source(const char *path, const char *pem, const char *what, bool trust, int *rc, char *err,
			size_t size)
{
	BIO *bio;

	if (pem) {
		bio = BIO_new_mem_buf(pem, -1);
		if (!bio)
			*rc = fail(err, size, -ENOMEM, "out of memory reading the %s", what);
		return bio;
	}
	if (!path) {
		*rc = fail(err, size, -EINVAL, "no %s configured", what);
		return NULL;
	}
	FILE *f = fopen(path, "r");
	if (!f) {
		*rc = fail(err, size, -errno, "cannot read %s '%s': %s", what, path, strerror(errno));
		return NULL;
	}
	if ((trust && (*rc = check_trust_mode(f, path, what, err, size))) ||
	    (*rc = check_stray_key(f, path, what, trust, err, size))) {
		fclose(f);
		return NULL;
	}
	bio = BIO_new_fp(f, BIO_CLOSE);
	if (!bio) {
		fclose(f);
		*rc = fail(err, size, -ENOMEM, "out of memory reading the %s", what);
	}
	return bio;
}

static const char *source_name(const char *path, const char *pem)
{
	return pem ? "(in memory)" : path;
}

/* OpenSSL fills each certificate's cache of decoded extensions the first
 * time a handshake looks at it; a context shared by threads has it filled
 * here, before any of them does. */
static void prime_caches(SSL_CTX *sc)
{
	STACK_OF(X509_OBJECT) *objs = X509_STORE_get0_objects(SSL_CTX_get_cert_store(sc));
	STACK_OF(X509) *chain = NULL;
	X509 *leaf = SSL_CTX_get0_certificate(sc);

	for (int i = 0; i < sk_X509_OBJECT_num(objs); i++) {
		X509 *x = X509_OBJECT_get0_X509(sk_X509_OBJECT_value(objs, i));
		if (x)
			X509_check_purpose(x, -1, 0);
	}
	if (leaf)
		X509_check_purpose(leaf, -1, 0);
	if (SSL_CTX_get0_chain_certs(sc, &chain) && chain)
		for (int i = 0; i < sk_X509_num(chain); i++)
			X509_check_purpose(sk_X509_value(chain, i), -1, 0);
}

static int load_ca(const struct gg_tls_options *o, SSL_CTX *sc, char *err, size_t size)
{
	X509_STORE *store = SSL_CTX_get_cert_store(sc);
	STACK_OF(X509_INFO) *infos = NULL;
	int rc = 0, count = 0;
	BIO *bio = open_source(o->ca_file, o->ca_pem, "CA file", true, &rc, err, size);

	if (!bio)
		goto out;
	infos = PEM_X509_INFO_read_bio(bio, NULL, NULL, NULL);
	if (!infos) {
		rc = fail(err, size, -EINVAL, "CA file '%s': %s", source_name(o->ca_file, o->ca_pem), openssl_reason());
		goto out;
	}
	for (int i = 0; i < sk_X509_INFO_num(infos); i++) {
		X509 *ca = sk_X509_INFO_value(infos, i)->x509;
		if (!ca)
			continue;
		if (!X509_STORE_add_cert(store, ca) || !SSL_CTX_add_client_CA(sc, ca)) {
			rc = fail(err, size, -EINVAL, "CA file '%s': %s", source_name(o->ca_file, o->ca_pem),
				  openssl_reason());
			goto out;
		}
		count++;
	}
	if (!count)
		rc = fail(err, size, -EINVAL, "CA file '%s' holds no certificate", source_name(o->ca_file, o->ca_pem));
out:
	sk_X509_INFO_pop_free(infos, X509_INFO_free);
	BIO_free(bio);
	return rc;
}

static int load_cert(const struct gg_tls_options *o, SSL_CTX *sc, char *err, size_t size)
{
	const char *name = source_name(o->cert_file, o->cert_pem);
	X509 *cert = NULL, *extra = NULL;
	int rc = 0;
	BIO *bio = open_source(o->cert_file, o->cert_pem, "certificate", false, &rc, err, size);

	if (!bio)
		goto out;
	cert = PEM_read_bio_X509(bio, NULL, NULL, NULL);
	if (!cert) {
		rc = fail(err, size, -EINVAL, "certificate '%s' holds no PEM certificate", name);
		goto out;
	}
	if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
		rc = fail(err, size, -EINVAL, "certificate '%s' has expired: every peer would refuse it", name);
		goto out;
	}
	if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
		char when[64];
		gg_tls_format_time(X509_get0_notBefore(cert), when, sizeof(when));
		rc = fail(err, size, -EINVAL, "certificate '%s' is not valid before %s: every peer would refuse it until "
			  "then", name, when);
		goto out;
	}
	if (!SSL_CTX_use_certificate(sc, cert)) {
		rc = fail(err, size, -EINVAL, "certificate '%s': %s", name, openssl_reason());
		goto out;
	}
	while ((extra = PEM_read_bio_X509(bio, NULL, NULL, NULL))) {
		if (!SSL_CTX_add0_chain_cert(sc, extra)) {
			rc = fail(err, size, -EINVAL, "certificate '%s': %s", name, openssl_reason());
			goto out;
		}
		extra = NULL;
	}
	ERR_clear_error(); /* the end of the PEM stream */
out:
	X509_free(extra);
	X509_free(cert);
	BIO_free(bio);
	return rc;
}

/* The verify errors of a CRL file that cannot check a chain, rather than
 * of the chain itself. */
static bool crl_error(int e)
{
	switch (e) {
	case X509_V_ERR_UNABLE_TO_GET_CRL:
	case X509_V_ERR_UNABLE_TO_DECRYPT_CRL_SIGNATURE:
	case X509_V_ERR_CRL_SIGNATURE_FAILURE:
	case X509_V_ERR_CRL_NOT_YET_VALID:
	case X509_V_ERR_CRL_HAS_EXPIRED:
	case X509_V_ERR_ERROR_IN_CRL_LAST_UPDATE_FIELD:
	case X509_V_ERR_ERROR_IN_CRL_NEXT_UPDATE_FIELD:
	case X509_V_ERR_UNABLE_TO_GET_CRL_ISSUER:
	case X509_V_ERR_KEYUSAGE_NO_CRL_SIGN:
	case X509_V_ERR_DIFFERENT_CRL_SCOPE:
	case X509_V_ERR_CRL_PATH_VALIDATION_ERROR:
		return true;
	default:
		return false;
	}
}

/* A key usage that does not allow TLS 1.3's signatures. */
static bool lacks_signing(X509 *cert)
{
	return (X509_get_extension_flags(cert) & EXFLAG_KUSAGE) && !(X509_get_key_usage(cert) & KU_DIGITAL_SIGNATURE);
}

static bool is_ca(X509 *cert)
{
	return X509_get_extension_flags(cert) & EXFLAG_CA;
}

/* "; its issuer is DN, the CA file's certificates are DN, ..." where
 * `error` says the issuer was not found among them, or "". */
static void issuer_note(int error, X509 *cert, X509_STORE *store, char *buf, size_t size)
{
	char dn[128], safe[3 * sizeof(dn)];
	size_t len;

	buf[0] = '\0';
	if (error != X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT && error != X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY &&
	    error != X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE)
		return;
	X509_NAME_oneline(X509_get_issuer_name(cert), dn, sizeof(dn));
	len = (size_t)snprintf(buf, size, "; its issuer is %s, the CA file's certificates are",
			       gg_escape(safe, sizeof(safe), dn, strlen(dn)));
	STACK_OF(X509_OBJECT) *objs = X509_STORE_get0_objects(store);
	int shown = 0;
	for (int i = 0; objs && i < sk_X509_OBJECT_num(objs) && len < size; i++) {
		X509 *ca = X509_OBJECT_get0_X509(sk_X509_OBJECT_value(objs, i));
		if (!ca)
			continue;
		if (shown++ == 3) {
			len += (size_t)snprintf(buf + len, size - len, ", ...");
			break;
		}
		X509_NAME_oneline(X509_get_subject_name(ca), dn, sizeof(dn));
		len += (size_t)snprintf(buf + len, size - len, "%s %s%s", shown > 1 ? "," : "",
					gg_escape(safe, sizeof(safe), dn, strlen(dn)), is_ca(ca) ? "" : " (not a CA)");
	}
}

/* This site's certificate must pass the checks its peers make of it: it
 * chains to the configured CA (which peers share), with the chain the
 * file gives, is not revoked by the configured CRL, and may serve both
 * ends of a connection (a gateway dials and accepts). Otherwise every
 * peer would refuse it, each naming only its own side of the problem. */
static int check_own_chain(const struct gg_tls_options *o, SSL_CTX *sc, char *err, size_t size)
{
	static const struct {
		int purpose;
		const char *use;
	} uses[] = { { X509_PURPOSE_SSL_CLIENT, "client" }, { X509_PURPOSE_SSL_SERVER, "server" } };
	const char *name = source_name(o->cert_file, o->cert_pem), *ca = source_name(o->ca_file, o->ca_pem);
	X509 *cert = SSL_CTX_get0_certificate(sc);
	STACK_OF(X509) *chain = NULL;
	int rc = 0;

	if (!SSL_CTX_get0_chain_certs(sc, &chain))
		return fail(err, size, -EINVAL, "certificate '%s': %s", name, openssl_reason());
	for (size_t i = 0; !rc && i < GG_ARRAY_LEN(uses); i++) {
		X509_STORE_CTX *v = X509_STORE_CTX_new();
		if (!v || !X509_STORE_CTX_init(v, SSL_CTX_get_cert_store(sc), cert, chain) ||
		    !X509_STORE_CTX_set_purpose(v, uses[i].purpose)) {
			rc = fail(err, size, -ENOMEM, "cannot check certificate '%s': %s", name, openssl_reason());
		} else if (X509_verify_cert(v) != 1) {
			int e = X509_STORE_CTX_get_error(v);
			if (crl_error(e))
				/* This site's own CRL: peers never see it, but it
				 * checks every peer's chain as it checked this one. */
				rc = fail(err, size, -EINVAL, "CRL file '%s' cannot check certificate '%s' (CA '%s'): %s: "
					  "with it this site would refuse every peer (the file needs a current CRL of the CA, "
					  "and of every intermediate CA)", o->crl_file, name, ca,
					  X509_verify_cert_error_string(e));
			else if (e == X509_V_ERR_INVALID_PURPOSE && (lacks_signing(cert) || is_ca(cert)))
				; /* the checks below name the cause, which OpenSSL takes for a purpose */
			else if (e == X509_V_ERR_INVALID_PURPOSE)
				rc = fail(err, size, -EINVAL, "certificate '%s' is not issued for TLS %s authentication (its key "
					  "usage or extended key usage), which a gateway needs: every peer would refuse it",
					  name, uses[i].use);
			else {
				/* (The names last: where they do not fit, they are cut.) */
				char note[400];
				issuer_note(e, cert, SSL_CTX_get_cert_store(sc), note, sizeof(note));
				rc = fail(err, size, -EINVAL, "certificate '%s' does not pass the checks peers make with CA "
					  "'%s': %s: every peer would refuse it%s", name, ca, X509_verify_cert_error_string(e),
					  note);
			}
		}
		X509_STORE_CTX_free(v);
	}
	/* What peers check beyond OpenSSL's purposes (tls_verify.c). */
	if (!rc && lacks_signing(cert))
		rc = fail(err, size, -EINVAL, "certificate '%s': its key usage lacks digitalSignature, which TLS 1.3 "
			  "signs with: every peer would refuse it", name);
	if (!rc && is_ca(cert))
		rc = fail(err, size, -EINVAL, "certificate '%s' is a CA's (basicConstraints CA:TRUE), which no site's "
			  "may be: every peer would refuse it", name);
	for (size_t i = 0; !rc && i < o->peer_count; i++) {
		char id[GG_TLS_IDENTITY_MAX + 8];
		if (gg_tls_cert_names(cert, &o->peers[i].identity))
			rc = fail(err, size, -EINVAL, "certificate '%s' names peer %s (%s): it is that site's, or passes "
				  "for it, and no site's own may: with it this site could speak as that one", name,
				  o->peers[i].name, gg_tls_identity_format(&o->peers[i].identity, id, sizeof(id)));
	}
	return rc;
}

static int no_passphrase(char *buf, int size, int rwflag, void *asked)
{
	*(bool *)asked = true;
	return 0;
}

static int load_key(const struct gg_tls_options *o, SSL_CTX *sc, char *err, size_t size)
{
	const char *name = source_name(o->key_file, o->key_pem);
	EVP_PKEY *key = NULL;
	BIO *bio = NULL;
	bool asked = false;
	int rc = 0;

	if (o->key_pem) {
		bio = open_source(NULL, o->key_pem, "private key", false, &rc, err, size);
	} else {
		struct stat st;
		int fd = o->key_file ? open(o->key_file, O_RDONLY | O_CLOEXEC) : -1;
		if (fd < 0) {
			rc = o->key_file ? fail(err, size, -errno, "cannot read private key '%s': %s", name, strerror(errno))
					 : fail(err, size, -EINVAL, "no private key configured");
			goto out;
		}
		if (fstat(fd, &st)) {
			rc = fail(err, size, -errno, "cannot read private key '%s': %s", name, strerror(errno));
			close(fd);
			goto out;
		}
		rc = check_key_mode(&st, name, err, size);
		if (rc || !(bio = BIO_new_fd(fd, BIO_CLOSE))) {
			close(fd);
			if (!rc)
				rc = fail(err, size, -ENOMEM, "out of memory reading the private key");
			goto out;
		}
	}
	if (!bio)
		goto out;
	key = PEM_read_bio_PrivateKey(bio, NULL, no_passphrase, &asked);
	if (!key) {
		rc = asked ? fail(err, size, -EINVAL,
				  "private key '%s' is encrypted; store it unencrypted, readable by its owner only", name)
			   : fail(err, size, -EINVAL, "private key '%s' holds no PEM private key", name);
		goto out;
	}
	if (!X509_check_private_key(SSL_CTX_get0_certificate(sc), key)) {
		rc = fail(err, size, -EINVAL, "private key '%s' does not match certificate '%s'", name,
			  source_name(o->cert_file, o->cert_pem));
		goto out;
	}
	if (!SSL_CTX_use_PrivateKey(sc, key))
		rc = fail(err, size, -EINVAL, "private key '%s': %s", name, openssl_reason());
out:
	EVP_PKEY_free(key);
	BIO_free(bio);
	return rc;
}

static int load_crl(const struct gg_tls_options *o, SSL_CTX *sc, char *err, size_t size)
{
	X509_STORE *store = SSL_CTX_get_cert_store(sc);
	X509_CRL *crl = NULL;
	int rc = 0, count = 0;
	BIO *bio = open_source(o->crl_file, NULL, "CRL file", true, &rc, err, size);

	if (!bio)
		goto out;
	while ((crl = PEM_read_bio_X509_CRL(bio, NULL, NULL, NULL))) {
		if (!X509_STORE_add_crl(store, crl)) {
			rc = fail(err, size, -EINVAL, "CRL file '%s': %s", o->crl_file, openssl_reason());
			goto out;
		}
		X509_CRL_free(crl);
		crl = NULL;
		count++;
	}
	ERR_clear_error();
	if (!count) {
		rc = fail(err, size, -EINVAL, "CRL file '%s' holds no PEM CRL", o->crl_file);
		goto out;
	}
	/* Every CA between a peer's certificate and the trusted one too: a
	 * revoked intermediate takes its certificates down with it. */
	X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK | X509_V_FLAG_CRL_CHECK_ALL);
out:
	X509_CRL_free(crl);
	BIO_free(bio);
	return rc;
}

/* The first RECORD_SUITES are those the engine protects records with. */
enum { RECORD_SUITES = 3 };
static const char *const tls13_suites[] = {
	"TLS_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256", "TLS_CHACHA20_POLY1305_SHA256",
	"TLS_AES_128_CCM_SHA256", "TLS_AES_128_CCM_8_SHA256",
};

/* The first ACCEPTED_GROUPS are elliptic-curve groups (about a millisecond
 * of CPU per handshake); the finite-field ones cost up to hundreds, which
 * would let anyone who reaches the port burn the gateway's CPU. */
enum { ACCEPTED_GROUPS = 5 };
static const char *const tls13_groups[] = {
	"X25519", "P-256", "P-384", "P-521", "X448", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192",
};

struct known_names {
	const char *noun;
	const char *const *names;
	size_t count, accepted;
	const char *refused_why;
	const char *supported;
};

static const struct known_names suite_names = {
	"TLS 1.3 ciphersuite", tls13_suites, GG_ARRAY_LEN(tls13_suites), RECORD_SUITES,
	"records are protected with AES-GCM or ChaCha20-Poly1305", GG_TLS_DEFAULT_CIPHERSUITES,
};
static const struct known_names group_names = {
	"key-exchange group", tls13_groups, GG_ARRAY_LEN(tls13_groups), ACCEPTED_GROUPS,
	"finite-field groups cost up to hundreds of milliseconds of CPU per handshake", "X25519:P-256:P-384:P-521:X448",
};

/* OpenSSL skips names it does not know; a typo must not silently weaken
 * or empty the list. */
static int check_names(const char *list, const struct known_names *k, char *err, size_t size)
{
	const char *p = list;

	if (!*p)
		return fail(err, size, -EINVAL, "the %s list is empty", k->noun);
	while (*p) {
		size_t n = strcspn(p, ":"), known = k->count;
		for (size_t i = 0; i < k->count; i++)
			if (strlen(k->names[i]) == n && !strncmp(k->names[i], p, n))
				known = i;
		/* Only what may be chosen is offered: the names refused below
		 * would only be refused next. */
		if (known == k->count)
			return fail(err, size, -EINVAL, "unknown %s '%.*s' (supported: %s)", k->noun, (int)GG_MIN(n, 64u),
				    p, k->supported);
		if (known >= k->accepted)
			return fail(err, size, -EINVAL, "%s '%s' is not supported: %s (supported: %s)", k->noun,
				    k->names[known], k->refused_why, k->supported);
		p += n;
		if (*p == ':')
			p++;
	}
	return 0;
}

int gg_tls_check_ciphersuites(const char *list, char *err, size_t err_size)
{
	return check_names(list, &suite_names, err, err_size);
}

static int build_ssl_ctx(const struct gg_tls_options *o, SSL_CTX **out, char *err, size_t size)
{
	static const unsigned char alpn[] = "\x0a" GG_TLS_ALPN;
	const char *suites = o->ciphersuites ? o->ciphersuites : GG_TLS_DEFAULT_CIPHERSUITES;
	const char *groups = o->groups ? o->groups : GG_TLS_DEFAULT_GROUPS;
	SSL_CTX *sc = NULL;
	int rc;

	ERR_clear_error();
	if ((rc = check_names(suites, &suite_names, err, size)) || (rc = check_names(groups, &group_names, err, size)))
		goto out;
	sc = SSL_CTX_new(TLS_method());
	if (!sc) {
		rc = fail(err, size, -ENOMEM, "cannot create a TLS context: %s", openssl_reason());
		goto out;
	}
	if (!SSL_CTX_set_min_proto_version(sc, TLS1_3_VERSION) || !SSL_CTX_set_max_proto_version(sc, TLS1_3_VERSION) ||
	    !SSL_CTX_set_ciphersuites(sc, suites) || !SSL_CTX_set1_groups_list(sc, groups) ||
	    SSL_CTX_set_alpn_protos(sc, alpn, sizeof(alpn) - 1) ||
	    !SSL_CTX_set_num_tickets(sc, 0)) {
		rc = fail(err, size, -EINVAL, "cannot set the TLS policy: %s", openssl_reason());
		goto out;
	}
	SSL_CTX_set_options(sc, SSL_OP_NO_TICKET | SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_RENEGOTIATION);
	SSL_CTX_set_session_cache_mode(sc, SSL_SESS_CACHE_OFF);
	/* OpenSSL runs the handshake only; the engine protects the records
	 * after it with the traffic secrets this callback hands over. Read
	 * ahead stays off: OpenSSL must not take bytes past the handshake's
	 * last record. */
	SSL_CTX_set_keylog_callback(sc, gg_tls_keylog_cb);
	SSL_CTX_set_verify(sc, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, gg_tls_verify_cb);
	SSL_CTX_set_verify_depth(sc, 8);
	SSL_CTX_set_info_callback(sc, gg_tls_info_cb);
	SSL_CTX_set_client_hello_cb(sc, gg_tls_client_hello_cb, NULL);
	SSL_CTX_set_alpn_select_cb(sc, gg_tls_alpn_select_cb, NULL);

	if ((rc = load_ca(o, sc, err, size)) || (rc = load_cert(o, sc, err, size)) || (rc = load_key(o, sc, err, size)))
		goto out;
	if ((o->crl_file && (rc = load_crl(o, sc, err, size))) ||
	    (!o->unchecked_own_cert && (rc = check_own_chain(o, sc, err, size))))
		goto out;
	prime_caches(sc);
	*out = sc;
	sc = NULL;
out:
	SSL_CTX_free(sc);
	ERR_clear_error();
	return rc;
}

static void free_options(struct gg_tls_options *o)
{
	free((char *)o->ca_file);
	free((char *)o->cert_file);
	free((char *)o->key_file);
	free((char *)o->crl_file);
	free((char *)o->ciphersuites);
	free((char *)o->groups);
	free((char *)o->ca_pem);
	free((char *)o->cert_pem);
	free((char *)o->key_pem);
	free((void *)o->peers);
}

static bool copy_string(const char **dst, const char *src)
{
	*dst = src ? strdup(src) : NULL;
	return !src || *dst;
}

static bool copy_peers(struct gg_tls_options *dst, const struct gg_tls_options *src)
{
	struct gg_tls_site *p = NULL;

	if (src->peer_count && !(p = malloc(src->peer_count * sizeof(*p))))
		return false;
	if (p)
		memcpy(p, src->peers, src->peer_count * sizeof(*p));
	dst->peers = p;
	dst->peer_count = src->peer_count;
	return true;
}

static int copy_options(struct gg_tls_options *dst, const struct gg_tls_options *src)
{
	memset(dst, 0, sizeof(*dst));
	if (copy_string(&dst->ca_file, src->ca_file) && copy_string(&dst->cert_file, src->cert_file) &&
	    copy_string(&dst->key_file, src->key_file) && copy_string(&dst->crl_file, src->crl_file) &&
	    copy_string(&dst->ciphersuites, src->ciphersuites) && copy_string(&dst->groups, src->groups) &&
	    copy_string(&dst->ca_pem, src->ca_pem) &&
	    copy_string(&dst->cert_pem, src->cert_pem) && copy_string(&dst->key_pem, src->key_pem) &&
	    copy_peers(dst, src)) {
		dst->unchecked_own_cert = src->unchecked_own_cert;
		return 0;
	}
	free_options(dst);
	return -ENOMEM;
}

int gg_tls_context_new(const struct gg_tls_options *opts, struct gg_tls_context **out, char *err, size_t err_size)
{
	struct gg_tls_context *ctx;
	int rc;

	*out = NULL;
	if (opts->peer_count > GG_TLS_MAX_SITES)
		return fail(err, err_size, -EINVAL, "%zu peers, more than the %d a TLS context takes", opts->peer_count,
			    GG_TLS_MAX_SITES);
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx || copy_options(&ctx->opts, opts)) {
		free(ctx);
		return fail(err, err_size, -ENOMEM, "out of memory creating the TLS context");
	}
	if (gg_tls_check_index() < 0) {
		rc = fail(err, err_size, -ENOMEM, "cannot register TLS connection data with OpenSSL");
		goto fail;
	}
	rc = build_ssl_ctx(&ctx->opts, &ctx->ssl_ctx, err, err_size);
	if (rc)
		goto fail;
	pthread_mutex_init(&ctx->lock, NULL);
	ctx->generation = 1;
	*out = ctx;
	return 0;
fail:
	free_options(&ctx->opts);
	free(ctx);
	return rc;
}

/* X509_V_OK when cert, with the intermediates in chain, chains to a CA of
 * store, else the first failure. Neither dates nor CRLs count: those of
 * the credentials in use may be why they are replaced (an expired
 * certificate or CA, a CRL past its next update, which this site alone
 * checks with), and check_own_chain() holds the new ones to them. */
static int verify_with(X509_STORE *store, X509 *cert, STACK_OF(X509) *chain)
{
	X509_STORE_CTX *v = X509_STORE_CTX_new();
	int e = X509_V_ERR_OUT_OF_MEM;

	if (v && X509_STORE_CTX_init(v, store, cert, chain)) {
		X509_VERIFY_PARAM *p = X509_STORE_CTX_get0_param(v);
		X509_VERIFY_PARAM_set_flags(p, X509_V_FLAG_NO_CHECK_TIME);
		X509_VERIFY_PARAM_clear_flags(p, X509_V_FLAG_CRL_CHECK | X509_V_FLAG_CRL_CHECK_ALL);
		e = X509_verify_cert(v) == 1 ? X509_V_OK : X509_STORE_CTX_get_error(v);
	}
	X509_STORE_CTX_free(v);
	return e;
}

/* Up to max of the identities (dNSName and URI subjectAltNames) cert
 * carries, as configs write them; how many. */
static unsigned cert_identities(X509 *cert, struct gg_tls_identity *ids, unsigned max)
{
	GENERAL_NAMES *names = X509_get_ext_d2i(cert, NID_subject_alt_name, NULL, NULL);
	unsigned n = 0;

	for (int i = 0; names && i < sk_GENERAL_NAME_num(names) && n < max; i++) {
		const GENERAL_NAME *gn = sk_GENERAL_NAME_value(names, i);
		const ASN1_STRING *s = gn->type == GEN_DNS ? gn->d.dNSName : gn->type == GEN_URI ? gn->d.uniformResourceIdentifier
												: NULL;
		if (!s || ASN1_STRING_length(s) <= 0 || ASN1_STRING_length(s) >= GG_TLS_IDENTITY_MAX)
			continue;
		ids[n].kind = gn->type == GEN_DNS ? GG_TLS_IDENTITY_DNS : GG_TLS_IDENTITY_URI;
		memcpy(ids[n].name, ASN1_STRING_get0_data(s), (size_t)ASN1_STRING_length(s));
		ids[n].name[ASN1_STRING_length(s)] = '\0';
		if (strlen(ids[n].name) == (size_t)ASN1_STRING_length(s)) /* no NUL inside */
			n++;
	}
	GENERAL_NAMES_free(names);
	return n;
}

/* What a reload must keep for the peers, which checked the credentials in
 * use with their own CA file and for this site's identity, and whose
 * certificates this site checked with its CA file: the new certificate
 * passes the CA file in use (the peers', as far as this site can tell),
 * the new CA file passes the certificate in use (issued as the peers'
 * were), and the new certificate still carries one of the identities of
 * the one in use (one of them is what the peers check). A move to another
 * CA so takes two reloads at every site: the new CA added to the CA file,
 * then the certificates changed. */
static int check_reload(const struct gg_tls_options *o, SSL_CTX *cur, SSL_CTX *fresh, char *err, size_t size)
{
	const char *name = source_name(o->cert_file, o->cert_pem), *ca = source_name(o->ca_file, o->ca_pem);
	X509 *was = SSL_CTX_get0_certificate(cur), *now = SSL_CTX_get0_certificate(fresh);
	STACK_OF(X509) *was_chain = NULL, *now_chain = NULL;
	int e;

	if (!was || !now || !SSL_CTX_get0_chain_certs(cur, &was_chain) || !SSL_CTX_get0_chain_certs(fresh, &now_chain))
		return fail(err, size, -EINVAL, "certificate '%s': %s", name, openssl_reason());
	if ((e = verify_with(SSL_CTX_get_cert_store(cur), now, now_chain)) != X509_V_OK)
		return fail(err, size, -EINVAL, "certificate '%s' does not pass the checks of the CA file in use, as the "
			    "peers check it with theirs: %s: they would refuse it (to move to another CA, add it to every "
			    "site's CA file and reload first, then change the certificates)", name,
			    X509_verify_cert_error_string(e));
	if ((e = verify_with(SSL_CTX_get_cert_store(fresh), was, was_chain)) != X509_V_OK)
		return fail(err, size, -EINVAL, "CA file '%s' does not pass the certificate in use, whose CA issued the "
			    "peers' certificates too: %s: with it this site would refuse its peers (to leave a CA, change "
			    "every site's certificate first)", ca, X509_verify_cert_error_string(e));
	struct gg_tls_identity ids[8];
	unsigned n = cert_identities(was, ids, GG_ARRAY_LEN(ids));
	for (unsigned i = 0; i < n; i++)
		if (gg_tls_cert_names(now, &ids[i]))
			return 0;
	if (n) {
		char id[GG_TLS_IDENTITY_MAX + 8], list[512] = "";
		for (unsigned i = 0; i < n; i++)
			snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? " or " : "",
				 gg_tls_identity_format(&ids[i], id, sizeof(id)));
		return fail(err, size, -EINVAL, "certificate '%s' does not name %s, as the certificate in use does: the "
			    "peers check for this site's identity, and would refuse it", name, list);
	}
	return 0;
}

int gg_tls_context_reload(struct gg_tls_context *ctx, char *err, size_t err_size)
{
	SSL_CTX *fresh = NULL, *old;
	int rc = build_ssl_ctx(&ctx->opts, &fresh, err, err_size);

	if (rc)
		return rc;
	if (!ctx->opts.unchecked_own_cert) {
		SSL_CTX *cur = gg_tls_context_get_ssl_ctx(ctx);
		rc = cur ? check_reload(&ctx->opts, cur, fresh, err, err_size)
			 : fail(err, err_size, -ENOMEM, "cannot check the new credentials: %s", openssl_reason());
		SSL_CTX_free(cur);
		if (rc) {
			SSL_CTX_free(fresh);
			ERR_clear_error();
			return rc;
		}
	}
	pthread_mutex_lock(&ctx->lock);
	old = ctx->ssl_ctx;
	ctx->ssl_ctx = fresh;
	ctx->generation++;
	pthread_mutex_unlock(&ctx->lock);
	SSL_CTX_free(old); /* connections hold their own references */
	return 0;
}

unsigned gg_tls_context_generation(struct gg_tls_context *ctx)
{
	pthread_mutex_lock(&ctx->lock);
	unsigned g = ctx->generation;
	pthread_mutex_unlock(&ctx->lock);
	return g;
}

SSL_CTX *gg_tls_context_get_ssl_ctx(struct gg_tls_context *ctx)
{
	pthread_mutex_lock(&ctx->lock);
	SSL_CTX *sc = ctx->ssl_ctx;
	if (sc && !SSL_CTX_up_ref(sc))
		sc = NULL;
	pthread_mutex_unlock(&ctx->lock);
	return sc;
}

void gg_tls_context_free(struct gg_tls_context *ctx)
{
	if (!ctx)
		return;
	SSL_CTX_free(ctx->ssl_ctx);
	pthread_mutex_destroy(&ctx->lock);
	free_options(&ctx->opts);
	free(ctx);
}
