/* Identity parsing, credential loading (with the refusals and their
 * messages) and reloading while connections stay up. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>

#include "fileio.h"
#include "tls_engine.h"
#include "tls_pki.h"
#include "tls_test.h"

static char dir[64];
static struct gg_tls_pki *ca;

static void test_identity_parse(void)
{
	static const struct {
		const char *text;
		const char *why; /* NULL: valid */
	} cases[] = {
		{ "dns:site-b.gradgate.test", NULL },
		{ "dns:Site-B", NULL },
		{ "dns:a", NULL },
		{ "uri:spiffe://gradgate/site-b", NULL },
		{ "uri:urn:gradgate:site-b", NULL },
		{ "", "an identity is \"dns:NAME\" or \"uri:URI\"" },
		{ "site-b.gradgate.test", "an identity is \"dns:NAME\" or \"uri:URI\"" },
		{ "DNS:site-b", "an identity is \"dns:NAME\" or \"uri:URI\"" },
		{ "dns:", "a DNS name has 1 to 253 characters" },
		{ "dns:*.gradgate.test", "wildcards are not site identities" },
		{ "dns:a..b", "each DNS label has 1 to 63 characters (no empty label, no trailing dot)" },
		{ "dns:site-b.", "each DNS label has 1 to 63 characters (no empty label, no trailing dot)" },
		{ "dns:-site", "a DNS label neither starts nor ends with '-'" },
		{ "dns:site_b", "a DNS name holds only letters, digits, '-' and '.'" },
		{ "dns:10.0.0.1:7001", "a DNS name holds only letters, digits, '-' and '.'" },
		{ "uri:", "a URI starts with a scheme, as in uri:spiffe://gradgate/site-b" },
		{ "uri:gradgate/site-b", "a URI starts with a scheme, as in uri:spiffe://gradgate/site-b" },
		{ "uri:spiffe:", "the URI is empty after its scheme" },
		{ "uri:spiffe://gradgate/site b", "a URI holds no spaces, control or non-ASCII bytes" },
		{ "uri:sp_ffe://x", "a URI scheme holds only letters, digits, '+', '-' and '.'" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct gg_tls_identity id;
		const char *why = NULL;
		int rc = gg_tls_identity_parse(cases[i].text, &id, &why);
		if (!cases[i].why) {
			char back[GG_TLS_IDENTITY_MAX + 8];
			CHECK_EQ_INT(rc, 0);
			CHECK_STR(gg_tls_identity_format(&id, back, sizeof(back)), cases[i].text);
		} else {
			CHECK_EQ_INT(rc, -EINVAL);
			CHECK_STR(why, cases[i].why);
		}
	}

	char long_label[80] = "dns:", long_name[300] = "dns:", long_uri[300] = "uri:x:";
	memset(long_label + 4, 'a', 64);
	for (int i = 0; i < 63; i++)
		strcat(long_name, "abc.");
	strcat(long_name, "ab");
	memset(long_uri + 6, 'a', 260);
	struct gg_tls_identity id;
	const char *why;
	CHECK_EQ_INT(gg_tls_identity_parse(long_label, &id, &why), -EINVAL);
	CHECK_EQ_INT(gg_tls_identity_parse(long_name, &id, &why), -EINVAL);
	CHECK_STR(why, "a DNS name has 1 to 253 characters");
	CHECK_EQ_INT(gg_tls_identity_parse(long_uri, &id, &why), -EINVAL);
	CHECK_STR(why, "the identity is longer than 255 characters");

	struct gg_tls_site site;
	CHECK_EQ_INT(gg_tls_site_init(&site, "site-b", "uri:spiffe://gradgate/site-b", &why), 0);
	CHECK_STR(site.name, "site-b");
	CHECK_EQ_INT(gg_tls_site_init(&site, "site-b", "spiffe://gradgate/site-b", &why), -EINVAL);
}

static const char *path(const char *name)
{
	static char buf[8][128];
	static int next;
	char *p = buf[next++ % 8];
	snprintf(p, 128, "%s/%s", dir, name);
	return p;
}

static void write_file(const char *name, const char *text, mode_t mode)
{
	const char *p = path(name);
	FILE *f;

	unlink(p);
	f = fopen(p, "w");
	CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
	CHECK(chmod(p, mode) == 0);
}

/* A certificate of `issuer` naming identity (and also, unless NULL), and
 * its key, written to files of those names. */
static void issue_by(struct gg_tls_pki *issuer, const char *identity, const char *also, const char *cert_name,
		     const char *key_name)
{
	struct gg_tls_cert_request req = { .identity = identity, .also = also, .valid_until_s = 3600 };
	char *cert, *key;

	CHECK(gg_tls_pki_issue(issuer, &req, &cert, &key) == 0);
	write_file(cert_name, cert, 0644);
	write_file(key_name, key, 0600);
	free(cert);
	free(key);
}

static void issue(const char *identity, const char *cert_name, const char *key_name)
{
	issue_by(ca, identity, NULL, cert_name, key_name);
}

static int try_context(const char *crl, const char *suites, char *err, size_t size, struct gg_tls_context **out)
{
	struct gg_tls_options o = {
		.ca_file = path("ca.pem"), .cert_file = path("a.pem"), .key_file = path("a.key"),
		.crl_file = crl, .ciphersuites = suites,
	};
	struct gg_tls_context *ctx = NULL;
	int rc = gg_tls_context_new(&o, &ctx, err, size);

	if (out)
		*out = ctx;
	else
		gg_tls_context_free(ctx);
	return rc;
}

/* want_err with each "DIR" replaced by the test directory. */
static void expect_refused(int want_rc, const char *want_err, const char *crl, const char *suites)
{
	char err[512] = "", want[512] = "";
	const char *p = want_err, *hit;

	CHECK_EQ_INT(try_context(crl, suites, err, sizeof(err), NULL), want_rc);
	while ((hit = strstr(p, "DIR"))) {
		strncat(want, p, (size_t)(hit - p));
		strcat(want, dir);
		p = hit + 3;
	}
	strcat(want, p);
	CHECK_STR(err, want);
}

/* With `name` (a file `what` of the context) at `mode`, the context is
 * refused: its permissions let group or others do `why`. */
static void expect_mode_refused(const char *name, const char *what, mode_t mode, const char *why)
{
	char want[512];

	CHECK(chmod(path(name), mode) == 0);
	snprintf(want, sizeof(want), "%s 'DIR/%s' has permissions %04o: %s", what, name, (unsigned)mode, why);
	expect_refused(-EPERM, want, NULL, NULL);
}

/* With `name` another user's, the context is refused (as root only, who
 * may chown). */
static void expect_owner_refused(const char *name, const char *what)
{
	char want[512];

	if (geteuid() != 0)
		return;
	CHECK(chown(path(name), 4242, 0) == 0);
	snprintf(want, sizeof(want),
		 "%s 'DIR/%s' belongs to uid 4242, who could replace it, and the gateway runs as root: run: chown "
		 "root: 'DIR/%s'",
		 what, name, name);
	expect_refused(-EPERM, want, NULL, NULL);
	CHECK(chown(path(name), 0, 0) == 0);
}

/* This site's certificate and key become one `issuer` issued for `req`. */
static void install_own(struct gg_tls_pki *issuer, const struct gg_tls_cert_request *req)
{
	char *own_pem, *own_key;

	CHECK(gg_tls_pki_issue(issuer, req, &own_pem, &own_key) == 0);
	write_file("a.pem", own_pem, 0644);
	write_file("a.key", own_key, 0600);
	free(own_pem);
	free(own_key);
}

static void test_loading(void)
{
	write_file("ca.pem", gg_tls_pki_ca_pem(ca), 0644);
	issue("dns:site-a.gradgate.test", "a.pem", "a.key");
	issue("dns:site-b.gradgate.test", "b.pem", "b.key");
	char err[512];
	CHECK_EQ_INT(try_context(NULL, NULL, err, sizeof(err), NULL), 0);
	CHECK_EQ_INT(gg_tls_check_key_permissions(path("a.key"), err, sizeof(err)), 0);

	static const char key_why[] = "group or others may access it (run chmod 600 on it)";
	expect_mode_refused("a.key", "private key", 0644, key_why);
	CHECK_EQ_INT(gg_tls_check_key_permissions(path("a.key"), err, sizeof(err)), -EPERM);
	expect_mode_refused("a.key", "private key", 0640, key_why);
	expect_mode_refused("a.key", "private key", 0602, key_why);
	CHECK(chmod(path("a.key"), 0400) == 0);
	CHECK_EQ_INT(try_context(NULL, NULL, err, sizeof(err), NULL), 0);
	CHECK(chmod(path("a.key"), 0600) == 0);
	/* Another user's key is theirs to read and replace. */
	expect_owner_refused("a.key", "private key");
	if (geteuid() == 0) {
		CHECK(chown(path("a.key"), 4242, 0) == 0);
		CHECK_EQ_INT(gg_tls_check_key_permissions(path("a.key"), err, sizeof(err)), -EPERM);
		CHECK(chown(path("a.key"), 0, 0) == 0);
	}
	CHECK_EQ_INT(try_context(NULL, NULL, err, sizeof(err), NULL), 0);

	/* Whoever may write the CA file chooses whom the gateway trusts. */
	static const char ca_why[] = "group or others may write it, and so choose whom this gateway trusts (run "
				     "chmod go-w on it)";
	expect_mode_refused("ca.pem", "CA file", 0664, ca_why);
	expect_mode_refused("ca.pem", "CA file", 0646, ca_why);
	CHECK(chmod(path("ca.pem"), 0644) == 0);
	expect_owner_refused("ca.pem", "CA file");
	CHECK_EQ_INT(try_context(NULL, NULL, err, sizeof(err), NULL), 0);
	/* Nor may anyone else write in its folder, which would let them put
	 * another file in its place: a reload (SIGHUP) checks this too. */
	char open_want[512];
	CHECK(chmod(dir, 0777) == 0);
	snprintf(open_want, sizeof(open_want),
		 "CA file 'DIR/ca.pem': folder DIR (mode 0777) may be written by every user, without the sticky "
		 "bit: they could put another file in its place, and so choose whom this gateway trusts (run chmod "
		 "go-w on it)");
	expect_refused(-EPERM, open_want, NULL, NULL);
	CHECK(chmod(dir, 0700) == 0);
	CHECK_EQ_INT(try_context(NULL, NULL, err, sizeof(err), NULL), 0);

	CHECK(rename(path("ca.pem"), path("ca.moved")) == 0);
	expect_refused(-ENOENT, "cannot read CA file 'DIR/ca.pem': No such file or directory", NULL, NULL);
	CHECK(rename(path("ca.moved"), path("ca.pem")) == 0);

	/* Site b's key does not belong to site a's certificate. */
	CHECK(rename(path("a.key"), path("a.saved")) == 0);
	CHECK(link(path("b.key"), path("a.key")) == 0);
	expect_refused(-EINVAL, "private key 'DIR/a.key' does not match certificate 'DIR/a.pem'", NULL, NULL);
	CHECK(unlink(path("a.key")) == 0);

	/* An encrypted key would need a passphrase nobody can type into a daemon. */
	BIO *bio = BIO_new(BIO_s_mem());
	EVP_PKEY *key = EVP_EC_gen("P-256");
	char *text;
	CHECK(bio && key && PEM_write_bio_PrivateKey(bio, key, EVP_aes_256_cbc(), (unsigned char *)"pw", 2, NULL, NULL));
	long len = BIO_get_mem_data(bio, &text);
	char *copy = strndup(text, (size_t)len);
	write_file("a.key", copy, 0600);
	free(copy);
	EVP_PKEY_free(key);
	BIO_free(bio);
	expect_refused(-EINVAL, "private key 'DIR/a.key' is encrypted; store it unencrypted, readable by its owner only",
		       NULL, NULL);
	write_file("a.key", "not a key\n", 0600);
	expect_refused(-EINVAL, "private key 'DIR/a.key' holds no PEM private key", NULL, NULL);
	CHECK(rename(path("a.saved"), path("a.key")) == 0);

	/* This site's certificate is checked as its peers will check it: one
	 * from another CA, or without both TLS uses, is refused at load. */
	struct gg_tls_pki *other;
	CHECK(gg_tls_pki_new("other CA", &other) == 0);
	struct gg_tls_cert_request foreign = { .identity = "dns:site-a.gradgate.test", .valid_until_s = 3600 };
	CHECK(rename(path("a.pem"), path("a.pem.saved")) == 0 && rename(path("a.key"), path("a.saved")) == 0);
	install_own(other, &foreign);
	gg_tls_pki_free(other);
	expect_refused(-EINVAL, "certificate 'DIR/a.pem' does not pass the checks peers make with CA 'DIR/ca.pem': "
				"unable to get local issuer certificate: every peer would refuse it; its issuer is "
				"/CN=other CA, the CA file's certificates are /CN=Test CA", NULL, NULL);
	struct gg_tls_cert_request server_only = { .identity = "dns:site-a.gradgate.test", .valid_until_s = 3600,
						   .no_client_auth = true };
	install_own(ca, &server_only);
	expect_refused(-EINVAL, "certificate 'DIR/a.pem' is not issued for TLS client authentication (its key usage "
				"or extended key usage), which a gateway needs: every peer would refuse it", NULL, NULL);
	/* Beyond OpenSSL's purposes, peers refuse a CA's certificate. */
	struct gg_tls_cert_request ca_leaf = { .identity = "dns:site-a.gradgate.test", .valid_until_s = 3600, .ca = true };
	install_own(ca, &ca_leaf);
	expect_refused(-EINVAL, "certificate 'DIR/a.pem' is a CA's (basicConstraints CA:TRUE), which no site's may be: "
				"every peer would refuse it", NULL, NULL);
	/* A key usage without signing, which OpenSSL takes for a wrong
	 * purpose, is named as what it is. */
	struct gg_tls_cert_request no_sign = { .identity = "dns:site-a.gradgate.test", .valid_until_s = 3600,
					       .no_signature = true };
	install_own(ca, &no_sign);
	expect_refused(-EINVAL, "certificate 'DIR/a.pem': its key usage lacks digitalSignature, which TLS 1.3 signs with: "
				"every peer would refuse it", NULL, NULL);
	CHECK(rename(path("a.pem.saved"), path("a.pem")) == 0 && rename(path("a.saved"), path("a.key")) == 0);
	CHECK_EQ_INT(try_context(NULL, NULL, err, sizeof(err), NULL), 0);

	expect_refused(-EINVAL, "unknown TLS 1.3 ciphersuite 'TLS_AES_256_GCM_SHA385' (supported: TLS_AES_256_GCM_SHA384:"
				"TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256)", NULL,
		       "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA385");
	expect_refused(-EINVAL, "the TLS 1.3 ciphersuite list is empty", NULL, "");
	CHECK_EQ_INT(try_context(NULL, "TLS_CHACHA20_POLY1305_SHA256", err, sizeof(err), NULL), 0);

	/* A key in the certificate's file is as readable as that file, which
	 * OpenSSL would read past: held to the key's rules there. A CA file
	 * holds none, whatever its mode. */
	char *cert_text, *key_text, both[8192];
	size_t cert_len, key_len;
	CHECK(gg_read_small_file(path("a.pem"), 4096, &cert_text, &cert_len) == 0);
	CHECK(gg_read_small_file(path("a.key"), 4096, &key_text, &key_len) == 0);
	snprintf(both, sizeof(both), "%s%s", cert_text, key_text);
	CHECK(rename(path("a.pem"), path("a.pem.saved")) == 0);
	write_file("a.pem", both, 0644);
	expect_refused(-EPERM, "certificate 'DIR/a.pem' holds a private key and has permissions 0644: group or others "
			       "may read the key (run chmod 600 on it, or keep the key in the key file only)", NULL, NULL);
	CHECK(chmod(path("a.pem"), 0600) == 0);
	CHECK_EQ_INT(try_context(NULL, NULL, err, sizeof(err), NULL), 0);
	snprintf(both, sizeof(both), "%s%s", key_text, cert_text); /* the key first */
	write_file("a.pem", both, 0640);
	expect_refused(-EPERM, "certificate 'DIR/a.pem' holds a private key and has permissions 0640: group or others "
			       "may read the key (run chmod 600 on it, or keep the key in the key file only)", NULL, NULL);
	CHECK(chmod(path("a.pem"), 0600) == 0);
	expect_owner_refused("a.pem", "certificate");
	CHECK(rename(path("a.pem.saved"), path("a.pem")) == 0);
	CHECK(rename(path("ca.pem"), path("ca.saved")) == 0);
	snprintf(both, sizeof(both), "%s%s", gg_tls_pki_ca_pem(ca), key_text);
	write_file("ca.pem", both, 0600);
	expect_refused(-EPERM, "CA file 'DIR/ca.pem' holds a private key: take it out (a CA's key belongs on no "
			       "gateway's host)", NULL, NULL);
	CHECK(rename(path("ca.saved"), path("ca.pem")) == 0);
	write_file("crl.pem", key_text, 0644);
	expect_refused(-EPERM, "CRL file 'DIR/crl.pem' holds a private key: take it out (a CA's key belongs on no "
			       "gateway's host)", path("crl.pem"), NULL);
	/* A line that only mentions a key is not one. */
	snprintf(both, sizeof(both), "a note: -----BEGIN PRIVATE KEY----- is not here\n%s", cert_text);
	write_file("a.pem", both, 0644);
	CHECK_EQ_INT(try_context(NULL, NULL, err, sizeof(err), NULL), 0);
	write_file("a.pem", cert_text, 0644);
	free(cert_text);
	free(key_text);
	CHECK_EQ_INT(try_context(NULL, NULL, err, sizeof(err), NULL), 0);

	write_file("empty.pem", "", 0644);
	expect_refused(-EINVAL, "CRL file 'DIR/empty.pem' holds no PEM CRL", path("empty.pem"), NULL);
	expect_refused(-ENOENT, "cannot read CRL file 'DIR/none.pem': No such file or directory", path("none.pem"), NULL);
	CHECK(chmod(path("empty.pem"), 0666) == 0); /* checked before it is read */
	expect_refused(-EPERM, "CRL file 'DIR/empty.pem' has permissions 0666: group or others may write it, and so "
			       "choose whom this gateway trusts (run chmod go-w on it)", path("empty.pem"), NULL);

	struct gg_tls_cert_request old = { .identity = "dns:site-a.gradgate.test", .valid_from_s = -7200, .valid_until_s = -3600 };
	char *cert, *k;
	CHECK(gg_tls_pki_issue(ca, &old, &cert, &k) == 0);
	write_file("a.pem", cert, 0644);
	write_file("a.key", k, 0600);
	free(cert);
	free(k);
	expect_refused(-EINVAL, "certificate 'DIR/a.pem' has expired: every peer would refuse it", NULL, NULL);

	/* Valid from an hour on: refused, naming the date. */
	struct gg_tls_cert_request early = { .identity = "dns:site-a.gradgate.test", .valid_from_s = 3600,
					     .valid_until_s = 7200 };
	CHECK(gg_tls_pki_issue(ca, &early, &cert, &k) == 0);
	write_file("a.pem", cert, 0644);
	write_file("a.key", k, 0600);
	BIO *pem = BIO_new_mem_buf(cert, -1);
	X509 *x = pem ? PEM_read_bio_X509(pem, NULL, NULL, NULL) : NULL;
	struct tm from;
	char want[256], when[64];
	CHECK(x && ASN1_TIME_to_tm(X509_get0_notBefore(x), &from));
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &from);
	snprintf(want, sizeof(want), "certificate 'DIR/a.pem' is not valid before %s: every peer would refuse it until then",
		 when);
	expect_refused(-EINVAL, want, NULL, NULL);
	X509_free(x);
	BIO_free(pem);
	free(cert);
	free(k);
	issue("dns:site-a.gradgate.test", "a.pem", "a.key");
}

static void pump(struct gg_tls_engine *from, struct gg_tls_engine *to)
{
	const uint8_t *src;
	uint8_t *dst;
	size_t n;

	while ((n = gg_tls_engine_tx_data(from, &src)) && gg_tls_engine_rx_space(to, &dst) >= n) {
		memcpy(dst, src, n);
		gg_tls_engine_rx_commit(to, n);
		gg_tls_engine_tx_consume(from, n);
	}
}

static struct gg_tls_engine *engine(struct gg_tls_context *ctx, enum gg_tls_role role, const char *identity)
{
	struct gg_tls_site s;
	struct gg_tls_engine *e;
	const char *why;

	CHECK(gg_tls_site_init(&s, "peer", identity, &why) == 0);
	struct gg_tls_engine_config cfg = { .role = role, .peer_addr = "127.0.0.1:1", .sites = &s, .site_count = 1 };
	CHECK(gg_tls_engine_new(ctx, &cfg, &e) == 0);
	return e;
}

/* Runs the handshake of c and s as far as it goes; returns 0 when both
 * completed. */
static int drive(struct gg_tls_engine *c, struct gg_tls_engine *s)
{
	int rc_c = -EAGAIN, rc_s = -EAGAIN;

	for (int i = 0; i < 10 && (rc_c == -EAGAIN || rc_s == -EAGAIN); i++) {
		rc_c = gg_tls_engine_handshake(c);
		pump(c, s);
		rc_s = gg_tls_engine_handshake(s);
		pump(s, c);
	}
	return rc_c || rc_s ? -1 : 0;
}

static void exchange(struct gg_tls_engine *from, struct gg_tls_engine *to)
{
	char buf[16];

	CHECK_EQ_INT(gg_tls_engine_write(from, "still here", 10), 10);
	pump(from, to);
	CHECK_EQ_INT(gg_tls_engine_read(to, buf, sizeof(buf)), 10);
	CHECK(!memcmp(buf, "still here", 10));
}

static void test_reload(void)
{
	struct gg_tls_context *server, *client;
	char err[512];

	CHECK_EQ_INT(try_context(NULL, NULL, err, sizeof(err), &server), 0); /* site a */
	struct gg_tls_options co = { .ca_file = path("ca.pem"), .cert_file = path("b.pem"), .key_file = path("b.key") };
	CHECK_EQ_INT(gg_tls_context_new(&co, &client, err, sizeof(err)), 0);
	CHECK_EQ_INT(gg_tls_context_generation(server), 1);

	/* A connection made before the reload. */
	struct gg_tls_engine *c1 = engine(client, GG_TLS_CLIENT, "dns:site-a.gradgate.test");
	struct gg_tls_engine *s1 = engine(server, GG_TLS_SERVER, "dns:site-b.gradgate.test");
	CHECK_EQ_INT(drive(c1, s1), 0);

	/* The server's files now hold a renewed certificate, which names
	 * another name too. */
	issue_by(ca, "dns:site-a.gradgate.test", "dns:site-z.gradgate.test", "a.pem", "a.key");
	CHECK_EQ_INT(gg_tls_context_reload(server, err, sizeof(err)), 0);
	CHECK_EQ_INT(gg_tls_context_generation(server), 2);
	exchange(c1, s1);
	exchange(s1, c1);

	struct gg_tls_engine *c2 = engine(client, GG_TLS_CLIENT, "dns:site-z.gradgate.test");
	struct gg_tls_engine *s2 = engine(server, GG_TLS_SERVER, "dns:site-b.gradgate.test");
	CHECK_EQ_INT(drive(c2, s2), 0);
	gg_tls_engine_free(c2);
	gg_tls_engine_free(s2);

	/* A failed reload keeps what was loaded. */
	CHECK(chmod(path("a.key"), 0644) == 0);
	CHECK_EQ_INT(gg_tls_context_reload(server, err, sizeof(err)), -EPERM);
	CHECK_CONTAINS(err, "has permissions 0644");
	CHECK_EQ_INT(gg_tls_context_generation(server), 2);
	c2 = engine(client, GG_TLS_CLIENT, "dns:site-z.gradgate.test");
	s2 = engine(server, GG_TLS_SERVER, "dns:site-b.gradgate.test");
	CHECK_EQ_INT(drive(c2, s2), 0);
	exchange(c1, s1);

	gg_tls_engine_free(c2);
	gg_tls_engine_free(s2);
	/* Engines outlive their context. */
	gg_tls_context_free(server);
	exchange(s1, c1);
	gg_tls_engine_free(c1);
	gg_tls_engine_free(s1);
	gg_tls_context_free(client);
}

/* A reload keeps what the peers check: credentials the peers would refuse
 * (a certificate from another CA, or for another identity, as the files of
 * another deployment or of a site the config does not know would be), or
 * a CA file that would refuse the peers, are refused, and what was loaded
 * stays. A move to another CA in two reloads is taken. */
static void test_reload_refused(void)
{
	struct gg_tls_context *server;
	struct gg_tls_pki *other;
	char err[512];

	CHECK(gg_tls_pki_new("Other CA", &other) == 0);
	issue("dns:site-a.gradgate.test", "a.pem", "a.key");
	CHECK_EQ_INT(try_context(NULL, NULL, err, sizeof(err), &server), 0);

	issue("dns:site-c.gradgate.test", "a.pem", "a.key");
	CHECK_EQ_INT(gg_tls_context_reload(server, err, sizeof(err)), -EINVAL);
	CHECK_CONTAINS(err, "a.pem' does not name dns:site-a.gradgate.test, as the certificate in use does: the peers "
			    "check for this site's identity, and would refuse it");

	/* Another deployment's three files. */
	issue_by(other, "dns:site-a.gradgate.test", NULL, "a.pem", "a.key");
	write_file("ca.pem", gg_tls_pki_ca_pem(other), 0644);
	CHECK_EQ_INT(gg_tls_context_reload(server, err, sizeof(err)), -EINVAL);
	CHECK_CONTAINS(err, "a.pem' does not pass the checks of the CA file in use, as the peers check it with theirs: "
			    "unable to get local issuer certificate: they would refuse it (to move to another CA, add it "
			    "to every site's CA file and reload first, then change the certificates)");
	CHECK_EQ_INT(gg_tls_context_generation(server), 1);

	/* The move, in order: both CAs, then the new certificate, then the new
	 * CA alone. */
	char both[8192];
	snprintf(both, sizeof(both), "%s%s", gg_tls_pki_ca_pem(ca), gg_tls_pki_ca_pem(other));
	issue("dns:site-a.gradgate.test", "a.pem", "a.key");
	write_file("ca.pem", both, 0644);
	CHECK_EQ_INT(gg_tls_context_reload(server, err, sizeof(err)), 0);
	issue_by(other, "dns:site-a.gradgate.test", NULL, "a.pem", "a.key");
	CHECK_EQ_INT(gg_tls_context_reload(server, err, sizeof(err)), 0);
	write_file("ca.pem", gg_tls_pki_ca_pem(other), 0644);
	CHECK_EQ_INT(gg_tls_context_reload(server, err, sizeof(err)), 0);
	CHECK_EQ_INT(gg_tls_context_generation(server), 4);
	/* Back in one step: refused, as the peers now check with the new CA
	 * alone. */
	issue("dns:site-a.gradgate.test", "a.pem", "a.key");
	write_file("ca.pem", gg_tls_pki_ca_pem(ca), 0644);
	CHECK_EQ_INT(gg_tls_context_reload(server, err, sizeof(err)), -EINVAL);
	CHECK_CONTAINS(err, "does not pass the checks of the CA file in use");
	/* Both CAs again, and the new one's certificate in use; then the old
	 * CA alone, with a certificate of its own: that CA file would refuse
	 * the peers, whose certificates the new CA issued as it did the one
	 * in use. */
	issue_by(other, "dns:site-a.gradgate.test", NULL, "a.pem", "a.key");
	write_file("ca.pem", both, 0644);
	CHECK_EQ_INT(gg_tls_context_reload(server, err, sizeof(err)), 0);
	issue("dns:site-a.gradgate.test", "a.pem", "a.key");
	write_file("ca.pem", gg_tls_pki_ca_pem(ca), 0644);
	CHECK_EQ_INT(gg_tls_context_reload(server, err, sizeof(err)), -EINVAL);
	CHECK_CONTAINS(err, "CA file '");
	CHECK_CONTAINS(err, "ca.pem' does not pass the certificate in use, whose CA issued the peers' certificates too");
	CHECK_EQ_INT(gg_tls_context_generation(server), 5);

	gg_tls_context_free(server);
	gg_tls_pki_free(other);
}

/* A site's own certificate names none of its peers: one that does is a
 * peer's, put in its place, or passes for one. Refused at creation and at
 * a reload, which keeps what was loaded. */
static void test_names_peer(void)
{
	struct gg_tls_site peers[2];
	const char *why;
	CHECK(gg_tls_site_init(&peers[0], "site-b", "dns:site-b.gradgate.test", &why) == 0);
	CHECK(gg_tls_site_init(&peers[1], "site-c", "uri:spiffe://gradgate.test/site-c", &why) == 0);
	char ca_file[128], cert_file[128], key_file[128], err[512], want[512];
	snprintf(ca_file, sizeof(ca_file), "%s", path("ca.pem")); /* path()'s buffers are reused */
	snprintf(cert_file, sizeof(cert_file), "%s", path("a.pem"));
	snprintf(key_file, sizeof(key_file), "%s", path("a.key"));
	struct gg_tls_options o = { .ca_file = ca_file, .cert_file = cert_file, .key_file = key_file, .peers = peers,
				    .peer_count = 2 };
	struct gg_tls_context *ctx;

	issue("dns:site-a.gradgate.test", "a.pem", "a.key");
	CHECK_EQ_INT(gg_tls_context_new(&o, &ctx, err, sizeof(err)), 0);
	peers[0].identity.name[0] = 'X'; /* the context keeps its own copy */

	issue("dns:site-b.gradgate.test", "a.pem", "a.key");
	CHECK_EQ_INT(gg_tls_context_reload(ctx, err, sizeof(err)), -EINVAL);
	snprintf(want, sizeof(want), "certificate '%s' names peer site-b (dns:site-b.gradgate.test): it is that "
		 "site's, or passes for it, and no site's own may: with it this site could speak as that one", cert_file);
	CHECK_STR(err, want);
	CHECK_EQ_INT(gg_tls_context_generation(ctx), 1);

	struct gg_tls_cert_request both = { .identity = "dns:site-a.gradgate.test",
					    .also = "uri:spiffe://gradgate.test/site-c", .valid_until_s = 3600 };
	install_own(ca, &both);
	CHECK_EQ_INT(gg_tls_context_reload(ctx, err, sizeof(err)), -EINVAL);
	CHECK_CONTAINS(err, "names peer site-c (uri:spiffe://gradgate.test/site-c): it is that site's");
	gg_tls_context_free(ctx);
	peers[0].identity.name[0] = 's';
	CHECK_EQ_INT(gg_tls_context_new(&o, &ctx, err, sizeof(err)), -EINVAL);
	CHECK_CONTAINS(err, "names peer site-c");
	CHECK(ctx == NULL);

	/* Another site of the same CA is none of this site's business. */
	issue("dns:site-a.gradgate.test", "a.pem", "a.key");
	CHECK_EQ_INT(gg_tls_context_new(&o, &ctx, err, sizeof(err)), 0);
	CHECK_EQ_INT(gg_tls_context_reload(ctx, err, sizeof(err)), 0);
	CHECK_EQ_INT(gg_tls_context_generation(ctx), 2);
	gg_tls_context_free(ctx);

	o.peer_count = GG_TLS_MAX_SITES + 1;
	CHECK_EQ_INT(gg_tls_context_new(&o, &ctx, err, sizeof(err)), -EINVAL);
	CHECK_STR(err, "17 peers, more than the 16 a TLS context takes");
}

static void remove_dir(void)
{
	static const char *const names[] = { "ca.pem", "a.pem", "a.key", "b.pem", "b.key", "empty.pem" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		unlink(path(names[i]));
	rmdir(dir);
}

/* A group list with a typo or a finite-field group is refused by name
 * before OpenSSL, which would skip what it does not know, sees it. */
static void test_groups(void)
{
	struct gg_tls_context *ctx;
	char err[300];
	struct gg_tls_options o = { .groups = "X25519:ffdhe8192" };

	CHECK_EQ_INT(gg_tls_context_new(&o, &ctx, err, sizeof(err)), -EINVAL);
	CHECK_STR(err, "key-exchange group 'ffdhe8192' is not supported: finite-field groups cost up to hundreds of "
		       "milliseconds of CPU per handshake (supported: X25519:P-256:P-384:P-521:X448)");
	o.groups = "X25519:secp256r1";
	CHECK_EQ_INT(gg_tls_context_new(&o, &ctx, err, sizeof(err)), -EINVAL);
	CHECK_STR(err, "unknown key-exchange group 'secp256r1' (supported: X25519:P-256:P-384:P-521:X448)");
	o.groups = "";
	CHECK_EQ_INT(gg_tls_context_new(&o, &ctx, err, sizeof(err)), -EINVAL);
	CHECK_STR(err, "the key-exchange group list is empty");
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/gg-tls-context-XXXXXX");
	CHECK(mkdtemp(dir));
	CHECK(gg_tls_pki_new("Test CA", &ca) == 0);

	test_identity_parse();
	test_loading();
	test_reload();
	test_reload_refused();
	test_names_peer();
	test_groups();

	gg_tls_pki_free(ca);
	remove_dir();
	printf("test_tls_context: ok\n");
	return 0;
}
